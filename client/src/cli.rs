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

/// `--reg`: a registration strategy by name.
pub type RegArg = RegStrategy;

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
///
/// `--transport`, `--remote-inv`, `--reg` and `--poll` take a comma list
/// (`--poll busy,event`): `nfsrdma bench` runs one variant per combination
/// of the values given ([`ConnArgs::choices`]); every other subcommand takes
/// one value ([`ConnArgs::check_single`]).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Connection options")]
pub struct ConnArgs {
    /// Transport to the server (bench: a comma list, one variant each).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tcp",
        global = true
    )]
    pub transport: Vec<TransportArg>,
    /// NFS port [default: 2049 for tcp, 20049 for rdma].
    #[arg(long, global = true)]
    pub port: Option<u16>,
    /// MOUNT port [default: ask the server's rpcbind].
    #[arg(long, global = true)]
    pub mount_port: Option<u16>,
    /// RDMA: offer remote invalidation (RFC 8797) (bench: a comma list).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "on",
        global = true
    )]
    pub remote_inv: Vec<OnOff>,
    /// RDMA: memory registration strategy (bench: a comma list).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "mw",
        global = true
    )]
    pub reg: Vec<RegArg>,
    /// RDMA: completion polling mode (bench: a comma list).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "adaptive",
        global = true
    )]
    pub poll: Vec<PollArg>,
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

/// One combination of the list-valued connection options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnChoice {
    /// `--transport`.
    pub transport: TransportArg,
    /// `--remote-inv`.
    pub remote_inv: OnOff,
    /// `--reg`.
    pub reg: RegArg,
    /// `--poll`.
    pub poll: PollArg,
}

impl TransportArg {
    /// The flag's spelling of this value.
    pub fn name(self) -> &'static str {
        match self {
            TransportArg::Tcp => "tcp",
            TransportArg::Rdma => "rdma",
        }
    }
}

impl OnOff {
    /// The flag's spelling of this value.
    pub fn name(self) -> &'static str {
        match self {
            OnOff::On => "on",
            OnOff::Off => "off",
        }
    }
}

impl PollArg {
    /// The flag's spelling of this value.
    pub fn name(self) -> &'static str {
        match self {
            PollArg::Busy => "busy",
            PollArg::Event => "event",
            PollArg::Adaptive => "adaptive",
        }
    }
}

fn first<T: Copy>(v: &[T], default: T) -> T {
    v.first().copied().unwrap_or(default)
}

impl ConnArgs {
    /// The client options these flags select (the first value of an
    /// option given as a list; see [`ConnArgs::check_single`]).
    pub fn to_options(&self) -> ConnectOptions {
        self.options_for(&ConnChoice {
            transport: first(&self.transport, TransportArg::Tcp),
            remote_inv: first(&self.remote_inv, OnOff::On),
            reg: first(&self.reg, RegStrategy::default()),
            poll: first(&self.poll, PollArg::Adaptive),
        })
    }

    /// The options given more than one value, by flag name.
    pub fn list_options(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (name, n) in [
            ("--transport", self.transport.len()),
            ("--remote-inv", self.remote_inv.len()),
            ("--reg", self.reg.len()),
            ("--poll", self.poll.len()),
        ] {
            if n > 1 {
                out.push(name);
            }
        }
        out
    }

    /// An error naming the first option given a list, for the subcommands
    /// that take one value.
    pub fn check_single(&self) -> Result<(), String> {
        match self.list_options().first() {
            None => Ok(()),
            Some(name) => Err(format!(
                "{name} takes a list only with `nfsrdma bench`; give one value"
            )),
        }
    }

    /// Every combination of the list-valued options, in order: transport
    /// varies slowest, then remote invalidation, registration, polling.
    pub fn choices(&self) -> Vec<ConnChoice> {
        let mut out = Vec::new();
        for &transport in &self.transport {
            for &remote_inv in &self.remote_inv {
                for &reg in &self.reg {
                    for &poll in &self.poll {
                        out.push(ConnChoice {
                            transport,
                            remote_inv,
                            reg,
                            poll,
                        });
                    }
                }
            }
        }
        out
    }

    /// The client options of one combination.
    pub fn options_for(&self, c: &ConnChoice) -> ConnectOptions {
        let mut sys = AuthSys::current_process();
        if let Some(u) = self.uid {
            sys.uid = u;
        }
        if let Some(g) = self.gid {
            sys.gid = g;
            sys.gids.clear();
        }
        ConnectOptions {
            transport: match c.transport {
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
                remote_inv: c.remote_inv == OnOff::On,
                reg: c.reg,
                poll: match c.poll {
                    PollArg::Busy => PollMode::Busy,
                    PollArg::Event => PollMode::Event,
                    PollArg::Adaptive => PollMode::default(),
                },
                ..RdmaOptions::default()
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
