//! The gateway (docs/gateway.md): one forward-proxy address for every
//! crawler. Each connection is relayed through one healthy proxy of the
//! fleet, chosen by the session and filters the crawler writes in its
//! proxy username; the crawler authenticates with its discovery token and
//! never sees the upstreams' credentials.
//!
//! A request passes its layers once, in one direction, each a file:
//! `accept` (the listener; `admission` bounds who gets a connection
//! before a byte is read), `sign_in` (the token and the `username`
//! grammar), `route` (the choice: `choose`'s rendezvous hashing and two
//! random choices over the `fleet`'s eligible upstreams, their names
//! pinned, what `sessions` remembers, the suspects and the caps `counts`
//! keeps), `connect` for a `CONNECT` (`upstream` dials an upstream and
//! asks its tunnel) or `forward` for an absolute-form request, `tunnel`
//! (the relay, bounded), and the account (`metrics`). Beside them,
//! `blame` says whose failure an answer is and `answers` writes every
//! answer a crawler gets, marked so.

mod accept;
mod admission;
mod answers;
mod blame;
mod choose;
mod connect;
mod counts;
mod fleet;
mod forward;
pub mod metrics;
mod route;
mod sessions;
mod sign_in;
pub(crate) mod tunnel;
mod upstream;
pub mod username;

use std::time::Duration;

pub use accept::serve;
pub use fleet::{warm_upstreams, ApiFleet, Candidates, Fleet, Upstream};
pub use route::Gateway;

/// The gateway's bounds and defaults (`--gateway-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Connections open at once; one more is closed when accepted.
    pub max_connections: usize,
    /// Connections one source address may hold open at once (0: half of
    /// `max_connections`, which also bounds any value given).
    pub max_per_address: usize,
    /// Connections one client (token) may hold open at once.
    pub max_per_client: u32,
    /// Connections the gateway sends through one upstream at once.
    pub max_per_upstream: u32,
    /// The most upstreams passed over at once for failing a connection,
    /// as a percentage of the eligible ones (at least one).
    pub max_suspect_percent: u32,
    /// How long a session is remembered after its last use, unless its
    /// username says `ttl-<minutes>`.
    pub session_ttl: Duration,
    /// The longest `ttl-<minutes>` a username may ask.
    pub max_session_ttl: Duration,
    /// Sessions remembered at once.
    pub max_sessions: usize,
    /// Time a client has to send a request's header (also the idle time
    /// allowed between requests of a kept-alive connection).
    pub header_read_timeout: Duration,
    /// A tunnel or upstream connection with no byte either way this long
    /// is closed.
    pub idle_timeout: Duration,
    /// Time an upstream has to accept a connection and answer its CONNECT.
    pub upstream_timeout: Duration,
    /// Statuses of a plain-http answer that say the upstream is banned by
    /// the site: that upstream cools down for that site.
    pub ban_statuses: Vec<u16>,
    /// Requests traced per million (0 to 1,000,000).
    pub traced_per_million: u32,
    /// How long a stopping gateway waits for its open connections and
    /// tunnels to end before they are cut.
    pub drain_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_connections: 1536,
            max_per_address: 512,
            max_per_client: 4096,
            max_per_upstream: 256,
            max_suspect_percent: 10,
            session_ttl: Duration::from_secs(30 * 60),
            max_session_ttl: Duration::from_secs(24 * 3600),
            // About 250 bytes a session (its client and id, its upstream's
            // key, a deadline, the map's slot; estimated from the types,
            // not measured): 25 MB at the cap, where a million took ~230
            // MB of the gateway Pod's 256Mi.
            max_sessions: 100_000,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            upstream_timeout: Duration::from_secs(10),
            ban_statuses: vec![403, 429],
            traced_per_million: 10_000,
            drain_timeout: Duration::from_secs(20),
        }
    }
}
