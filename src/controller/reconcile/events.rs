//! Records the Events [`plan::events`] decides on, on the Proxy, through
//! the process's recorder. Best effort: the recorder logs a failure, and a
//! pass never fails for an Event.

use kube::Resource;

use crate::api::{Proxy, ProxyStatus};
use crate::controller::context::Context;
use crate::controller::plan;
use crate::events::Note;

/// Records the transitions of a pass that wrote `after` over `before`.
pub(super) async fn record_pass(
    ctx: &Context,
    proxy: &Proxy,
    before: &ProxyStatus,
    after: &ProxyStatus,
) {
    for note in plan::events::pass_notes(before, after) {
        record(ctx, proxy, Some(note)).await;
    }
}

/// Records `note`, if any, on `proxy`.
pub(super) async fn record(ctx: &Context, proxy: &Proxy, note: Option<Note>) {
    if let (Some(events), Some(note)) = (ctx.events.as_ref(), note) {
        events.record(&proxy.object_ref(&()), note).await;
    }
}
