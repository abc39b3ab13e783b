//! A real Kubernetes test cluster: the launcher's parts, and the handle the
//! operator's tests use to start one per test binary.

pub mod node;
