//! Create on one host: the background job `create` waits for, and the
//! sequence it runs (existing domain, pool, base image, then the build).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tracing::{debug, info_span, Instrument};

use super::check::pool_state_word;
use super::conn::HostLink;
use super::image::{ensure_base, ImageSource};
use super::pending::JobState;
use super::protocol::{Build, Existing, Request};
use super::{seed, ImageLock, KvmProvider};

/// Redirect hops an image download follows at most.
const MAX_REDIRECTS: usize = 10;
use crate::config::MachineType;
use crate::provider::{BoxError, CreateRequest, ErrorClass, Op, ProviderError, Tagged};

impl KvmProvider {
    /// Starts `create_on` in the background unless it already runs for
    /// this name; returns a receiver of its state.
    pub(super) fn start_create(
        &self,
        link: &Arc<HostLink>,
        mt: &MachineType,
        img: &ImageSource,
        req: &CreateRequest,
        id: &str,
    ) -> tokio::sync::watch::Receiver<JobState> {
        let work = || {
            let (this, link, mt, img, req2, id2) = (
                self.clone(),
                link.clone(),
                mt.clone(),
                img.clone(),
                req.clone(),
                id.to_string(),
            );
            let span = info_span!("kvm.create", host = %link.host.name, name = %req.name);
            async move {
                this.create_on(&link, &mt, &img, &req2)
                    .await
                    .map_err(|e| this.create_failed(&id2, e))
            }
            .instrument(span)
        };
        self.inner
            .pending
            .start(&req.name, &req.uid, &req.installation_id, work)
    }

    /// The error a failed create reports.
    fn create_failed(&self, id: &str, cause: BoxError) -> ProviderError {
        let e = self.err(Op::Create, id, cause);
        // Something vanishing mid-create is worth a retry, not a "gone"
        // verdict.
        if !e.is(ErrorClass::NotFound) {
            return e;
        }
        ProviderError::wrap(
            ErrorClass::Transient,
            Op::Create,
            &self.inner.name,
            id,
            Tagged::new(ErrorClass::Transient, e.to_string()),
        )
    }

    fn image_lock(&self, host: &str, base: &str) -> ImageLock {
        // A poisoned map only means a panic between get and insert of a
        // plain HashMap; the map is still consistent.
        let mut m = self
            .inner
            .image_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        m.entry((host.to_string(), base.to_string()))
            .or_default()
            .clone()
    }

    /// The image HTTP client: no redirect to another scheme, none out of
    /// `kvm.allowedImageUrls` from a URL inside it, at most
    /// [`MAX_REDIRECTS`] hops.
    async fn http(&self) -> Result<&reqwest::Client, BoxError> {
        self.inner
            .http
            .get_or_try_init(|| async {
                // main installs it; this may run first (tests, tools).
                crate::tls::install_ring();
                let allow = self.inner.cfg.allowed_image_urls.clone();
                let policy = reqwest::redirect::Policy::custom(move |attempt| {
                    let Some(first) = attempt.previous().first().cloned() else {
                        return attempt.follow();
                    };
                    if attempt.previous().len() > MAX_REDIRECTS {
                        return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
                    }
                    match super::urls::redirect(&allow, &first, attempt.url()) {
                        Ok(()) => attempt.follow(),
                        Err(why) => attempt.error(why),
                    }
                });
                reqwest::Client::builder()
                    .redirect(policy)
                    .connect_timeout(Duration::from_secs(10))
                    .build()
                    .map_err(|e| -> BoxError { format!("building the HTTP client: {e}").into() })
            })
            .await
    }

    async fn create_on(
        &self,
        link: &HostLink,
        mt: &MachineType,
        img: &ImageSource,
        req: &CreateRequest,
    ) -> Result<(), BoxError> {
        let host = &link.host;
        debug!(pool = %host.pool, bridge = %host.bridge, vcpus = mt.vcpus, memory_mib = mt.memory_mib, image = %img.base_volume, cloud_init_bytes = req.cloud_init.len(), "KVM create resolved");
        let op = link.open().await?;

        // 1. Existing domain? Else is the pool usable?
        let (name, uid, pool) = (req.name.clone(), req.uid.clone(), host.pool.clone());
        let first = op
            .call("looking up domain", Request::Existing { name, uid, pool })
            .await?;
        match first {
            Existing::Done => {
                debug!("domain already defined");
                return Ok(());
            }
            Existing::Foreign(got) => {
                return Err(Tagged::permanent(format!(
                    "domain {} on host {} carries UID {got:?}, not this Proxy's {:?}",
                    req.name, host.name, req.uid
                ))
                .into())
            }
            Existing::PoolInactive(s) => {
                return Err(Tagged::new(
                    ErrorClass::Transient,
                    format!("storage pool {:?} is {}", host.pool, pool_state_word(s)),
                )
                .into())
            }
            Existing::Build => {}
        }

        // 2. Base image, once per (host, volume).
        let lock = self.image_lock(&host.name, &img.base_volume);
        let base_path = {
            let _held = lock.lock().await;
            let http = self.http().await?;
            ensure_base(&op, http, &host.pool, img).await?
        };

        // 3. Overlay, seed, define, start.
        let user_data = req.cloud_init.expose().to_string();
        let vendor = seed::vendor_data(
            self.inner.cfg.installs_guest_agent(),
            &self.inner.cfg.vendor_data,
        );
        let iso = seed::seed_iso(&req.name, &user_data, &vendor, Utc::now())
            .map_err(|e| Tagged::permanent(format!("building the seed ISO: {e}")))?;
        drop(user_data);
        let b = Build {
            name: req.name.clone(),
            uid: req.uid.clone(),
            installation: req.installation_id.clone(),
            pool: host.pool.clone(),
            bridge: host.bridge.clone(),
            capacity: (self.inner.cfg.disk_size_gb_or_default() as u64) << 30,
            base_path,
            base_format: img.format,
            firmware: img.firmware,
            domain_type: host.domain_type,
            memory_mib: mt.memory_mib,
            vcpus: mt.vcpus,
            iso,
        };
        op.call::<()>("building the domain", Request::Build(b))
            .await?;
        Ok(())
    }
}
