//! A real Kubernetes test cluster: the launcher's parts, and the handle the
//! operator's tests use to start one per test binary; and the trace backend
//! (Jaeger) the tests export their spans to.

pub mod after_ready;
pub mod handle;
pub mod jaeger;
pub mod launch;
pub mod node;
pub mod pki;
pub mod process;

pub use handle::{bin, bin_dir, Options, TestCluster};
pub use jaeger::jaeger;
