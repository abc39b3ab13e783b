//! `test-cluster`: starts etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler on loopback, plus node agents, and stops them all on
//! SIGTERM, SIGINT, or when its parent goes away.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(code) = test_cluster::node::helper_main(&args[1..]) {
        std::process::exit(code);
    }
    eprintln!("test-cluster: not built yet");
    std::process::exit(2);
}
