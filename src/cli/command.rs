//! The command line: the operator, or `gateway` (the gateway alone), each
//! with the operator's flags.

use clap::{Parser, Subcommand};

use super::Flags;

/// What one process runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// The operator: campaigns for leadership, and while it leads runs
    /// the controllers; every replica serves the discovery API.
    #[default]
    Operator,
    /// Only the gateway (`egress-proxies-operator gateway`): it follows
    /// the leader's Lease and lease table but never campaigns.
    Gateway,
}

/// egress-proxies-operator: runs forward proxies (Squid) on Kubernetes, GCP
/// and KVM from `Proxy` objects, probes them through themselves, and leases
/// healthy ones to crawlers over an HTTP API.
#[derive(Parser, Debug)]
#[command(name = "egress-proxies-operator", version = crate::VERSION, about, long_about = None, args_override_self = true, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Without a command: the operator.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The operator's flags.
    #[command(flatten)]
    pub flags: Flags,
}

/// The commands besides the operator itself.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run only the gateway (docs/gateway.md), as its own Deployment.
    ///
    /// It watches Proxies and tokens, follows the leader's Lease and lease
    /// table, never campaigns for leadership and scales horizontally. It
    /// takes the operator's flags; --gateway-bind-address is required and
    /// --providers-config is not read.
    Gateway(Flags),
}

impl Cli {
    /// The flags, with the role the command line asks for.
    pub fn into_flags(self) -> Flags {
        match self.command {
            None => self.flags,
            Some(Command::Gateway(mut flags)) => {
                flags.role = Role::Gateway;
                flags
            }
        }
    }
}
