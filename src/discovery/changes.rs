//! The Proxy store's announced changes a listing has not taken yet, and
//! when the whole store was last walked (`rebuild.rs` takes them).

use std::collections::BTreeSet;
use std::time::Instant;

use tokio::sync::broadcast;

use crate::proxy_store::Touch;

/// The source's announced changes not yet in the listing, and when the
/// whole source was last walked.
pub(super) struct Changes {
    /// `None`: the source announces nothing (every build walks it).
    pub(super) follow: Option<broadcast::Receiver<Touch>>,
    /// Announced changes the listing has not taken yet.
    pub(super) touched: BTreeSet<Touched>,
    /// Announced deletes the sweep has not taken yet.
    pub(super) gone: BTreeSet<Touched>,
    /// The listing, and the sweep, must walk the source: changes were
    /// missed or a relist replaced it (and at the start).
    pub(super) listing_walk: bool,
    pub(super) sweep_walk: bool,
    pub(super) walked: Option<Instant>,
    /// Walks of the whole source so far (the listing's and the sweep's).
    pub(super) walks: u64,
}

impl Changes {
    /// Takes what the source announced since the last call.
    pub(super) fn drain(&mut self) {
        let Some(rx) = self.follow.as_mut() else {
            return;
        };
        let open = crate::proxy_store::drain(rx, |t| match t {
            Touch::One(r) => {
                self.touched
                    .insert((r.namespace.unwrap_or_default(), r.name));
            }
            Touch::Gone(r) => {
                let at = (r.namespace.unwrap_or_default(), r.name);
                self.touched.insert(at.clone());
                self.gone.insert(at);
            }
            Touch::All => {
                self.listing_walk = true;
                self.sweep_walk = true;
            }
        });
        if !open {
            self.follow = None;
        }
    }
}

/// A Proxy an event named: (namespace, name).
pub(super) type Touched = (String, String);

impl Changes {
    /// Nothing announced yet: the first listing and sweep walk.
    pub(super) fn new(follow: Option<broadcast::Receiver<Touch>>) -> Self {
        Changes {
            follow,
            touched: BTreeSet::new(),
            gone: BTreeSet::new(),
            listing_walk: true,
            sweep_walk: true,
            walked: None,
            walks: 0,
        }
    }
}
