//! Who a request comes from, as the auth middleware names it.

use std::sync::Arc;

/// The client a request comes from: the name of its token, set by the
/// auth middleware.
#[derive(Debug, Clone)]
pub struct Client(pub Arc<str>);

/// The client name of `DISCOVERY_TOKEN`.
pub const DEFAULT_CLIENT: &str = "default";

/// The one client of an API without tokens.
pub const ANONYMOUS: &str = "anonymous";
