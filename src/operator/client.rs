//! The Kubernetes client every runnable shares. A hung API server must not
//! hang the operator, so:
//!
//! - connecting is bounded by [`CONNECT_TIMEOUT`];
//! - every request that is not a stream (a watch, a log follow) must get
//!   its response head within [`REQUEST_TIMEOUT`], and then its body must
//!   not pause longer than that between frames ([`Deadline`]);
//! - watches keep their own bound: kube-runtime's watcher asks the server
//!   to end each watch after 290 s and gives up on a stream that stays
//!   silent for 290 s plus a margin, then reconnects.
//!
//! kube's `Config::read_timeout` is left off on purpose: it bounds every
//! socket read, so it would also cut watches that are merely quiet (no
//! event for minutes is normal), unless it were longer than the watch
//! timeout, which would bound nothing useful.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Body as HttpBody, Frame};
use kube::client::{Body, ClientBuilder};
use kube::Client;
use tower::{BoxError, Layer, Service};

/// How long opening a connection to the API server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request may wait for its response head, and how long its
/// body may then pause between frames.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A request ran out of time.
#[derive(Debug, thiserror::Error)]
#[error("the Kubernetes API server did not answer within {} s", .0.as_secs_f64())]
pub struct TimedOut(pub Duration);

/// The operator's client from `config`, with [`CONNECT_TIMEOUT`] and
/// [`REQUEST_TIMEOUT`].
pub fn build(config: kube::Config) -> Result<Client, kube::Error> {
    build_with(config, CONNECT_TIMEOUT, REQUEST_TIMEOUT)
}

/// [`build`] with the given bounds (tests use short ones).
pub fn build_with(
    mut config: kube::Config,
    connect: Duration,
    request: Duration,
) -> Result<Client, kube::Error> {
    config.connect_timeout = Some(connect);
    config.read_timeout = None;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&DeadlineLayer(request))
        .build())
}

/// Pure: whether the request to `uri` is a long-lived stream, which the
/// deadline leaves alone (`watch=true`/`watch=1`, `follow=true`).
pub fn is_stream(uri: &Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "follow=true" | "follow=1"))
    })
}

/// Puts a [`Deadline`] in front of a service.
#[derive(Clone, Copy, Debug)]
pub struct DeadlineLayer(pub Duration);

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            limit: self.0,
        }
    }
}

/// Bounds each non-stream request: its response head, then each pause in
/// its body.
#[derive(Clone, Debug)]
pub struct Deadline<S> {
    inner: S,
    limit: Duration,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<Request<Body>> for Deadline<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<IdleBody<B>>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let limit = (!is_stream(req.uri())).then_some(self.limit);
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = match limit {
                None => response.await.map_err(Into::into)?,
                Some(limit) => tokio::time::timeout(limit, response)
                    .await
                    .map_err(|_| Box::new(TimedOut(limit)) as BoxError)?
                    .map_err(Into::into)?,
            };
            Ok(response.map(|inner| IdleBody {
                inner,
                limit,
                pause: None,
            }))
        })
    }
}

/// A response body that fails when it pauses longer than its limit.
pub struct IdleBody<B> {
    inner: B,
    limit: Option<Duration>,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> HttpBody for IdleBody<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.pause = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let Some(limit) = this.limit else {
                    return Poll::Pending;
                };
                let pause = this
                    .pause
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match pause.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(TimedOut(limit))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
