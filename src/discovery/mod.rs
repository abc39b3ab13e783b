//! The discovery and lease API (operator.md §4), served by every replica.
//! See docs/api.md. By job: `state` (what the handlers share; it names no
//! route), `hooks` (what the state holds of the outside), `changes` and
//! `rebuild` (the listing kept in step with the Proxy store), `client` and
//! `request` (who asks and what, read by the API's rules), `grant` (the
//! lease transaction), `handlers` (the routes), `replace` and `sessions`
//! (more routes), `pools` (a pool's demand and its refusals),
//! `middleware` (outermost first: panic recovery, a server span and a
//! request log line per request named by the matched route, incoming
//! `traceparent` honoured; body cap; bearer auth; forwarding to the
//! leader), `openapi` (the document), `serving` (router and server),
//! `model` (wire types and the listing/filter rules), `item` (a Proxy as
//! listed, and who sees its password), `listing` (the eligible proxies a
//! request chooses from, with the matches of recent filters), `error`
//! (the JSON error answer), `forward` (the leader view and the relay),
//! `feed` (followers' copy of the leader's table), `bench` (the
//! benchmark's routes, hidden behind `--bench-routes`),
//! `credentials_feed` (the upstreams' credentials handed to gateway
//! processes), `to_leader` (the leader's routes for what gateways tell
//! it; the sending side is `replica::to_leader`'s), `for_gateway` (what
//! a gateway in this process takes of the API). The files name each other without a cycle.

mod bench;
mod changes;
mod client;
pub mod credentials_feed;
mod error;
pub mod feed;
mod for_gateway;
mod freshness;
mod grant;
mod handlers;
mod hooks;
pub mod item;
mod listing;
pub mod metrics;
mod middleware;
pub mod model;
mod openapi;
mod pools;
mod rebuild;
mod replace;
mod request;
mod selector;
mod serving;
mod sessions;
mod state;
mod to_leader;
pub(crate) mod tokens;

pub use crate::replica::forward::{
    route, Forwarder, Leader, Route, Unavailable, FORWARD_TIMEOUT, HOLD_ENV,
};
pub use error::ApiError;
pub use for_gateway::GatewayParts;
pub use hooks::{GatewaySessions, Replacer, REPLACES_PER_WINDOW, REPLACE_WINDOW};
pub use listing::ListingData;
pub use middleware::{remote_parent, route_label, BODY_LIMIT, UNMATCHED};
pub use model::*;
pub use openapi::{openapi_json, served_openapi_json};
pub use replace::request_value;
pub use request::MAX_KEY_LEN;
pub use serving::{router, serve, serve_on, serve_within, sweep, SWEEP_EVERY};
pub use sessions::SessionReport;
pub use state::{
    ApiState, Client, Listing, ProxySource, ANONYMOUS, DEFAULT_CLIENT, LISTING_MAX_AGE,
    REFRESH_EVERY,
};
pub use tokens::TokenSet;

#[cfg(test)]
mod answer_tests;
#[cfg(test)]
mod tests;
