//! The Proxy reconciler: pure decisions in [`plan`], effects around them.

pub mod plan;
