//! The node agent: plays kubelet for one Node of the test cluster.
//!
//! It registers the Node (capacity, a Ready condition, a heartbeat Lease in
//! `kube-node-lease`) and runs the containers of every Pod bound to it as
//! real host processes: each Pod in its own network namespace on the
//! cluster's bridge (its own address), its own mount namespace (an overlay
//! of the host root, read-only where asked, volumes materialized and bound
//! at their mount paths), a cgroup v1 memory group with the container's
//! limit, and the securityContext's user and group.

pub mod net;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

/// One image the agent can "pull": a container whose image's repository
/// (the reference without tag or digest) is `image` runs `entrypoint` on the
/// host when the Pod gives no `command`. An image not in the list keeps its
/// Pod Pending with a reason that names it.
#[derive(Debug, Clone)]
pub struct ImageMapping {
    pub image: String,
    pub entrypoint: Vec<String>,
}

/// What a node needs to run.
pub struct NodeConfig {
    /// The Node's name.
    pub name: String,
    /// A client with this node's own credentials (`system:node:<name>`,
    /// group `system:nodes`).
    pub client: kube::Client,
    /// Where a Pod reaches the API server: `KUBERNETES_SERVICE_HOST` and
    /// `KUBERNETES_SERVICE_PORT` (an address on the bridge).
    pub api_host: Ipv4Addr,
    pub api_port: u16,
    /// The cluster's Pod network, shared by all its nodes.
    pub network: Arc<net::PodNetwork>,
    pub images: Vec<ImageMapping>,
    /// This node's state directory (volumes, logs).
    pub dir: PathBuf,
    /// The launcher binary, re-run for its hidden helper commands.
    pub exe: PathBuf,
}

/// A running node agent.
pub struct Node {
    _private: (),
}

impl Node {
    /// Registers the Node and starts running its Pods.
    pub async fn start(cfg: NodeConfig) -> anyhow::Result<Node> {
        let _ = cfg;
        anyhow::bail!("the node agent is not built yet")
    }

    /// Stops every Pod's processes and removes what they used (network
    /// namespace, veth, cgroup, state).
    pub async fn shutdown(self) {}
}

/// Entry point of the hidden helper commands the agent runs itself as
/// (`test-cluster __pod-<cmd> ...`). Returns None when `args` is not one.
pub fn helper_main(args: &[String]) -> Option<i32> {
    let _ = args;
    None
}
