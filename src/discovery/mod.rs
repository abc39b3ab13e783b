//! The discovery and lease API (operator.md §4), served by every replica.
//! See docs/api.md. By job: `state` (what the handlers share), `handlers`
//! (the routes), `middleware` (outermost first: panic recovery, a server
//! span and a request log line per request named by the matched route,
//! incoming `traceparent` honoured; body cap; bearer auth), `openapi` (the
//! document), `serving` (router and server), `model` (wire types and the
//! listing/filter rules), `item` (a Proxy as listed, and who sees its password), `listing` (the eligible proxies a request
//! chooses from, with the matches of recent filters), `error` (the JSON error answer), `forward`
//! (lease calls on a follower go to the leader), `bench` (the
//! benchmark's routes, hidden behind `--bench-routes`), `sessions` (the
//! gateway's session reports), `credentials_feed` (the upstreams'
//! credentials handed to gateway processes).

mod bench;
pub mod credentials_feed;
mod error;
pub mod feed;
mod forward;
mod freshness;
mod handlers;
pub mod internal;
pub mod item;
mod listing;
pub mod metrics;
mod middleware;
pub mod model;
mod openapi;
mod pools;
mod rebuild;
mod replace;
mod replay;
pub mod replicas;
mod selector;
mod serving;
mod sessions;
mod state;
mod to_leader;
pub(crate) mod tokens;

pub use error::ApiError;
pub use forward::{route, Forwarder, Leader, Route, Unavailable, FORWARD_TIMEOUT, HOLD_ENV};
pub use handlers::MAX_KEY_LEN;
pub use listing::ListingData;
pub use middleware::{remote_parent, route_label, BODY_LIMIT, UNMATCHED};
pub use model::*;
pub use openapi::{openapi_json, served_openapi_json};
pub use replace::{request_value, Replacer, REPLACES_PER_WINDOW, REPLACE_WINDOW};
pub use serving::{router, serve, serve_on, serve_within, sweep, SWEEP_EVERY};
pub use sessions::{GatewaySessions, SessionReport};
pub use state::{
    ApiState, Client, Listing, ProxySource, ANONYMOUS, DEFAULT_CLIENT, LISTING_MAX_AGE,
    REFRESH_EVERY,
};
pub use tokens::TokenSet;

#[cfg(test)]
mod tests;
