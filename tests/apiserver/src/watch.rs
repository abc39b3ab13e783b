//! Watch streams: newline-delimited JSON events from a resourceVersion on.

use crate::errors::ApiError;
use crate::resources::ResourceDef;
use crate::store::{Event, Filter, Store};
use crate::table;
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How often a watch that allows bookmarks gets one.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(2);

/// The parameters of one watch request.
#[derive(Debug, Clone, Default)]
pub struct WatchParams {
    pub resource_version: Option<String>,
    pub timeout: Option<Duration>,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    /// Some(includeObject) when the client asked for Table events.
    pub table: Option<String>,
}

struct Watcher {
    def: ResourceDef,
    filter: Filter,
    table: Option<String>,
    tx: mpsc::Sender<Bytes>,
}

impl Watcher {
    async fn send(&self, etype: &str, obj: &Value) -> bool {
        let object = match (&self.table, etype) {
            (Some(include), "ADDED" | "MODIFIED" | "DELETED") => {
                table::table(&self.def, std::slice::from_ref(obj), None, include, true)
            }
            _ => obj.clone(),
        };
        let mut line = json!({"type": etype, "object": object}).to_string();
        line.push('\n');
        self.tx.send(Bytes::from(line)).await.is_ok()
    }

    /// The event this watcher should see for `ev`, if any (selector transitions included).
    fn translate(&self, ev: &Event) -> Option<&'static str> {
        let now = self.filter.matches(&ev.object);
        match ev.etype {
            "MODIFIED" => {
                let before = ev.old.as_ref().is_some_and(|o| self.filter.matches(o));
                match (before, now) {
                    (true, true) => Some("MODIFIED"),
                    (false, true) => Some("ADDED"),
                    (true, false) => Some("DELETED"),
                    (false, false) => None,
                }
            }
            t => now.then_some(t),
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Value {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({"kind": self.def.kind, "apiVersion": self.def.api_version(), "metadata": meta})
    }
}

/// Start a watch; the response body streams until timeout, shutdown or disconnect.
pub fn start(
    store: Arc<Store>,
    def: ResourceDef,
    filter: Filter,
    params: WatchParams,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let w = Watcher {
        def,
        filter,
        table: params.table.clone(),
        tx,
    };
    tokio::spawn(async move {
        let mut changes = store.subscribe();
        let deadline =
            tokio::time::Instant::now() + params.timeout.unwrap_or(Duration::from_secs(1800));
        let rv_param = params.resource_version.clone().unwrap_or_default();
        let mut last: u64;
        if rv_param.is_empty() || rv_param == "0" || params.send_initial_events {
            let (items, rv) = store.list(&w.def, &w.filter);
            for it in &items {
                if !w.send("ADDED", it).await {
                    return;
                }
            }
            last = rv;
            if params.send_initial_events && params.bookmarks {
                let b = w.bookmark(rv, true);
                if !w.send("BOOKMARK", &b).await {
                    return;
                }
            }
        } else {
            match rv_param.parse::<u64>() {
                Ok(rv) => last = rv,
                Err(_) => {
                    let e = ApiError::bad_request(format!("invalid resourceVersion {rv_param:?}"));
                    w.send("ERROR", &e.to_status()).await;
                    return;
                }
            }
        }
        let mut next_bookmark = tokio::time::Instant::now() + BOOKMARK_INTERVAL;
        loop {
            changes.mark_unchanged();
            match store.events_since(&w.def.key(), last) {
                Err(e) => {
                    w.send("ERROR", &e.to_status()).await;
                    return;
                }
                Ok(evs) => {
                    for ev in evs {
                        last = ev.rv;
                        if let Some(t) = w.translate(&ev) {
                            if !w.send(t, &ev.object).await {
                                return;
                            }
                        }
                    }
                }
            }
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep_until(deadline) => return,
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep_until(next_bookmark) => {
                    next_bookmark = tokio::time::Instant::now() + BOOKMARK_INTERVAL;
                    if params.bookmarks {
                        // Everything up to the current rv has been delivered or filtered out.
                        let rv = store.current_rv().max(last);
                        if store.events_since(&w.def.key(), last).map(|e| e.is_empty()).unwrap_or(false) {
                            last = rv;
                        }
                        let b = w.bookmark(last, false);
                        if !w.send("BOOKMARK", &b).await {
                            return;
                        }
                    } else if w.tx.is_closed() {
                        return;
                    }
                }
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}
