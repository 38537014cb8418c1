//! Command-line pieces shared by the `nfsrdma` subcommands: the connection
//! options (one flattened clap struct, so that every subcommand, present
//! and future, takes the same flags) and the `SERVER:/export/path` target.

use crate::auth::{Auth, AuthSys};
use crate::client::{ConnectOptions, PollMode, RdmaOptions, RegStrategy};
use crate::transport::TransportKind;
use std::fmt;
use std::time::Duration;

/// `--transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    /// ONC RPC over TCP.
    Tcp,
    /// RPC-over-RDMA version 1.
    Rdma,
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// `--reg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RegArg {
    /// A memory window bound per RPC.
    Mw,
    /// A memory region registered per RPC.
    RegMr,
    /// Buffers registered once.
    Persistent,
}

/// `--poll`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PollArg {
    /// Spin on the completion queue.
    Busy,
    /// Sleep on completion events.
    Event,
    /// Spin, then sleep.
    Adaptive,
}

/// Connection options taken by every subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnArgs {
    /// Transport to the server.
    #[arg(long, value_enum, default_value_t = TransportArg::Tcp, global = true)]
    pub transport: TransportArg,
    /// NFS port [default: 2049 for tcp, 20049 for rdma].
    #[arg(long, global = true)]
    pub port: Option<u16>,
    /// MOUNT port [default: ask the server's rpcbind].
    #[arg(long, global = true)]
    pub mount_port: Option<u16>,
    /// RDMA: offer remote invalidation (RFC 8797).
    #[arg(long, value_enum, default_value_t = OnOff::On, global = true)]
    pub remote_inv: OnOff,
    /// RDMA: memory registration strategy.
    #[arg(long, value_enum, default_value_t = RegArg::Mw, global = true)]
    pub reg: RegArg,
    /// RDMA: completion polling mode.
    #[arg(long, value_enum, default_value_t = PollArg::Adaptive, global = true)]
    pub poll: PollArg,
    /// AUTH_SYS uid [default: this process's].
    #[arg(long, global = true)]
    pub uid: Option<u32>,
    /// AUTH_SYS gid [default: this process's].
    #[arg(long, global = true)]
    pub gid: Option<u32>,
    /// Seconds one transmission waits for its reply before it is resent.
    #[arg(long, default_value_t = 60.0, value_parser = parse_seconds, global = true)]
    pub timeo: f64,
    /// Retransmissions before a soft call fails.
    #[arg(long, default_value_t = 2, global = true)]
    pub retrans: u32,
    /// Fail calls after timeo × (retrans + 1) instead of retrying forever.
    #[arg(long, global = true)]
    pub soft: bool,
    /// READ size in bytes [default: the server's preferred size].
    #[arg(long, global = true)]
    pub rsize: Option<u32>,
    /// WRITE size in bytes [default: the server's preferred size].
    #[arg(long, global = true)]
    pub wsize: Option<u32>,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a number of seconds between 0 and 86400"
        )),
    }
}

impl ConnArgs {
    /// The client options these flags select.
    pub fn to_options(&self) -> ConnectOptions {
        let mut sys = AuthSys::current_process();
        if let Some(u) = self.uid {
            sys.uid = u;
        }
        if let Some(g) = self.gid {
            sys.gid = g;
            sys.gids.clear();
        }
        ConnectOptions {
            transport: match self.transport {
                TransportArg::Tcp => TransportKind::Tcp,
                TransportArg::Rdma => TransportKind::Rdma,
            },
            port: self.port,
            mount_port: self.mount_port,
            auth: Auth::Sys(sys),
            timeo: Duration::from_secs_f64(self.timeo),
            retrans: self.retrans,
            soft: self.soft,
            rsize: self.rsize,
            wsize: self.wsize,
            rdma: RdmaOptions {
                remote_inv: self.remote_inv == OnOff::On,
                reg: match self.reg {
                    RegArg::Mw => RegStrategy::Mw,
                    RegArg::RegMr => RegStrategy::RegMr,
                    RegArg::Persistent => RegStrategy::Persistent,
                },
                poll: match self.poll {
                    PollArg::Busy => PollMode::Busy,
                    PollArg::Event => PollMode::Event,
                    PollArg::Adaptive => PollMode::Adaptive,
                },
            },
            ..ConnectOptions::default()
        }
    }
}

/// A remote path: `SERVER:/export/path`; the server may be a host name, an
/// IPv4 address or a bracketed IPv6 address (`[::1]:/export`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePath {
    /// Host name or address (IPv6 without brackets).
    pub server: String,
    /// Absolute path on the server, normalised (no empty or `.`
    /// components, no trailing `/`).
    pub path: String,
}

impl fmt::Display for RemotePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.server.contains(':') {
            write!(f, "[{}]:{}", self.server, self.path)
        } else {
            write!(f, "{}:{}", self.server, self.path)
        }
    }
}

impl std::str::FromStr for RemotePath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| format!("{s:?} is not SERVER:/path ({why})");
        let (server, path) = if let Some(rest) = s.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            let path = after
                .strip_prefix(':')
                .ok_or_else(|| bad("':' expected after ']'"))?;
            (host, path)
        } else {
            s.split_once(':').ok_or_else(|| bad("no ':'"))?
        };
        if server.is_empty() {
            return Err(bad("empty server name"));
        }
        if !path.starts_with('/') {
            return Err(bad("the path must start with '/'"));
        }
        let comps: Vec<&str> = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        Ok(RemotePath {
            server: server.to_string(),
            path: format!("/{}", comps.join("/")),
        })
    }
}

impl RemotePath {
    /// The parent path and the last component (`None` for `/`).
    pub fn split_last(&self) -> Option<(String, String)> {
        let (parent, name) = self.path.rsplit_once('/')?;
        if name.is_empty() {
            return None;
        }
        let parent = if parent.is_empty() { "/" } else { parent };
        Some((parent.to_string(), name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let t: RemotePath = "srv:/export/a//b/./c/".parse().unwrap();
        assert_eq!(t.server, "srv");
        assert_eq!(t.path, "/export/a/b/c");
        assert_eq!(
            t.split_last(),
            Some(("/export/a/b".to_string(), "c".to_string()))
        );
        let t: RemotePath = "[::1]:/x".parse().unwrap();
        assert_eq!(t.server, "::1");
        assert_eq!(t.to_string(), "[::1]:/x");
        let t: RemotePath = "10.0.0.1:/".parse().unwrap();
        assert_eq!(t.path, "/");
        assert_eq!(t.split_last(), None);
        for bad in ["srv", ":/x", "srv:x", "[::1:/x", "[::1]/x", ""] {
            assert!(bad.parse::<RemotePath>().is_err(), "{bad}");
        }
    }
}
