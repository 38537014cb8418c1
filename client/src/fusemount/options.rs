//! `-o` mount options, in the spirit of mount.nfs(5).

use crate::cli::ConnArgs;
use crate::client::{ConnectOptions, RegStrategy};
use crate::transport::TransportKind;
use crate::Auth;
use std::time::Duration;

/// One `-o` option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOpt {
    /// `proto=tcp|rdma`.
    Proto(TransportKind),
    /// `port=N`.
    Port(u16),
    /// `mountport=N`.
    MountPort(u16),
    /// `rsize=N`.
    Rsize(u32),
    /// `wsize=N`.
    Wsize(u32),
    /// `remote_inv=on|off`.
    RemoteInv(bool),
    /// `reg=mw|reg-mr|persistent`.
    Reg(RegStrategy),
    /// `ac` (true) or `noac` (false).
    Ac(bool),
    /// `actimeo=S`: all four attribute cache times.
    Actimeo(u32),
    /// `acregmin=S`.
    AcRegMin(u32),
    /// `acregmax=S`.
    AcRegMax(u32),
    /// `acdirmin=S`.
    AcDirMin(u32),
    /// `acdirmax=S`.
    AcDirMax(u32),
    /// `ro` (true) or `rw` (false).
    Ro(bool),
    /// `uid=N` for AUTH_SYS.
    Uid(u32),
    /// `gid=N` for AUTH_SYS.
    Gid(u32),
    /// `soft` (true) or `hard` (false).
    Soft(bool),
    /// `timeo=N`: tenths of a second.
    Timeo(u32),
    /// `retrans=N`.
    Retrans(u32),
    /// `threads=N`: FUSE request threads.
    Threads(usize),
}

/// One `-o` argument: a comma-separated list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionList(pub Vec<MountOpt>);

fn num<T: std::str::FromStr>(key: &str, v: Option<&str>) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("option {key} needs a value ({key}=N)"))?;
    v.parse()
        .map_err(|_| format!("option {key}={v}: not a valid number"))
}

fn flag(key: &str, v: Option<&str>) -> Result<(), String> {
    match v {
        None => Ok(()),
        Some(v) => Err(format!("option {key} takes no value (got {key}={v})")),
    }
}

/// Parses one `-o` argument.
pub fn parse_list(s: &str) -> Result<OptionList, String> {
    let mut out = Vec::new();
    for item in s.split(',').filter(|i| !i.is_empty()) {
        let (key, val) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        let opt = match key {
            "proto" => match val {
                Some("tcp") => MountOpt::Proto(TransportKind::Tcp),
                Some("rdma") => MountOpt::Proto(TransportKind::Rdma),
                _ => {
                    return Err(format!(
                        "option proto={}: use tcp or rdma",
                        val.unwrap_or("")
                    ))
                }
            },
            "port" => MountOpt::Port(num(key, val)?),
            "mountport" => MountOpt::MountPort(num(key, val)?),
            "rsize" => MountOpt::Rsize(positive(key, num(key, val)?)?),
            "wsize" => MountOpt::Wsize(positive(key, num(key, val)?)?),
            "remote_inv" => match val {
                Some("on") => MountOpt::RemoteInv(true),
                Some("off") => MountOpt::RemoteInv(false),
                _ => {
                    return Err(format!(
                        "option remote_inv={}: use on or off",
                        val.unwrap_or("")
                    ))
                }
            },
            "reg" => match val.and_then(RegStrategy::from_name) {
                Some(r) => MountOpt::Reg(r),
                None => {
                    return Err(format!(
                        "option reg={}: use mw, reg-mr or persistent",
                        val.unwrap_or("")
                    ))
                }
            },
            "ac" => flag(key, val).map(|_| MountOpt::Ac(true))?,
            "noac" => flag(key, val).map(|_| MountOpt::Ac(false))?,
            "actimeo" => MountOpt::Actimeo(num(key, val)?),
            "acregmin" => MountOpt::AcRegMin(num(key, val)?),
            "acregmax" => MountOpt::AcRegMax(num(key, val)?),
            "acdirmin" => MountOpt::AcDirMin(num(key, val)?),
            "acdirmax" => MountOpt::AcDirMax(num(key, val)?),
            "ro" => flag(key, val).map(|_| MountOpt::Ro(true))?,
            "rw" => flag(key, val).map(|_| MountOpt::Ro(false))?,
            "uid" => MountOpt::Uid(num(key, val)?),
            "gid" => MountOpt::Gid(num(key, val)?),
            "soft" => flag(key, val).map(|_| MountOpt::Soft(true))?,
            "hard" => flag(key, val).map(|_| MountOpt::Soft(false))?,
            "timeo" => MountOpt::Timeo(positive(key, num(key, val)?)?),
            "retrans" => MountOpt::Retrans(num(key, val)?),
            "threads" => MountOpt::Threads(positive(key, num::<u32>(key, val)?)? as usize),
            // Accepted and meaningless here, as with mount.nfs.
            "vers" | "nfsvers" => match val {
                Some("3") => continue,
                _ => return Err("only NFS version 3 is supported (vers=3)".into()),
            },
            _ => return Err(format!("unknown mount option {item:?}")),
        };
        out.push(opt);
    }
    Ok(OptionList(out))
}

fn positive(key: &str, v: u32) -> Result<u32, String> {
    if v == 0 {
        Err(format!("option {key} must be above 0"))
    } else {
        Ok(v)
    }
}

/// Attribute cache times (seconds, as mount.nfs counts them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheTimes {
    /// Caching on (`ac`) or off (`noac`).
    pub enabled: bool,
    /// Regular files: shortest time.
    pub acregmin: Duration,
    /// Regular files: longest time.
    pub acregmax: Duration,
    /// Directories: shortest time.
    pub acdirmin: Duration,
    /// Directories: longest time.
    pub acdirmax: Duration,
}

impl Default for CacheTimes {
    fn default() -> Self {
        CacheTimes {
            enabled: true,
            acregmin: Duration::from_secs(3),
            acregmax: Duration::from_secs(60),
            acdirmin: Duration::from_secs(30),
            acdirmax: Duration::from_secs(60),
        }
    }
}

/// Everything a mount uses.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// The connection.
    pub conn: ConnectOptions,
    /// Attribute caching.
    pub cache: CacheTimes,
    /// Read-only mount.
    pub ro: bool,
    /// FUSE request threads.
    pub threads: usize,
}

impl MountOptions {
    /// The global connection flags, then the `-o` options in order (a later
    /// option wins, as with mount.nfs).
    pub fn from_args(conn: &ConnArgs, lists: &[OptionList]) -> MountOptions {
        let mut out = MountOptions {
            conn: conn.to_options(),
            cache: CacheTimes::default(),
            ro: false,
            threads: 4,
        };
        for o in lists.iter().flat_map(|l| l.0.iter()) {
            out.apply(o);
        }
        out
    }

    fn apply(&mut self, o: &MountOpt) {
        let secs = |s: u32| Duration::from_secs(u64::from(s));
        let c = &mut self.conn;
        match *o {
            MountOpt::Proto(t) => c.transport = t,
            MountOpt::Port(p) => c.port = Some(p),
            MountOpt::MountPort(p) => c.mount_port = Some(p),
            MountOpt::Rsize(n) => c.rsize = Some(n),
            MountOpt::Wsize(n) => c.wsize = Some(n),
            MountOpt::RemoteInv(b) => c.rdma.remote_inv = b,
            MountOpt::Reg(r) => c.rdma.reg = r,
            MountOpt::Ac(b) => self.cache.enabled = b,
            MountOpt::Actimeo(s) => {
                let d = secs(s);
                self.cache.acregmin = d;
                self.cache.acregmax = d;
                self.cache.acdirmin = d;
                self.cache.acdirmax = d;
            }
            MountOpt::AcRegMin(s) => self.cache.acregmin = secs(s),
            MountOpt::AcRegMax(s) => self.cache.acregmax = secs(s),
            MountOpt::AcDirMin(s) => self.cache.acdirmin = secs(s),
            MountOpt::AcDirMax(s) => self.cache.acdirmax = secs(s),
            MountOpt::Ro(b) => self.ro = b,
            MountOpt::Uid(u) => {
                if let Auth::Sys(s) = &mut c.auth {
                    s.uid = u;
                }
            }
            MountOpt::Gid(g) => {
                if let Auth::Sys(s) = &mut c.auth {
                    s.gid = g;
                    s.gids.clear();
                }
            }
            MountOpt::Soft(b) => c.soft = b,
            MountOpt::Timeo(ds) => c.timeo = Duration::from_millis(u64::from(ds) * 100),
            MountOpt::Retrans(n) => c.retrans = n,
            MountOpt::Threads(n) => self.threads = n,
        }
        if self.cache.acregmax < self.cache.acregmin {
            self.cache.acregmax = self.cache.acregmin;
        }
        if self.cache.acdirmax < self.cache.acdirmin {
            self.cache.acdirmax = self.cache.acdirmin;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let l = parse_list("proto=rdma,port=20049,rsize=65536,noac,ro,uid=7,soft,timeo=5").unwrap();
        assert_eq!(l.0.len(), 8);
        assert_eq!(l.0[0], MountOpt::Proto(TransportKind::Rdma));
        assert_eq!(l.0[3], MountOpt::Ac(false));
        assert!(parse_list("reg=persistent,remote_inv=off,actimeo=0,vers=3").is_ok());
        for bad in [
            "proto=udp",
            "port=x",
            "rsize=0",
            "noac=1",
            "bogus",
            "reg=none",
            "vers=4",
            "port",
        ] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn later_options_win() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            conn: ConnArgs,
        }
        let t = T::parse_from(["t"]);
        let o = MountOptions::from_args(
            &t.conn,
            &[
                parse_list("actimeo=10,acregmax=20,timeo=15").unwrap(),
                parse_list("hard,rw,port=1234").unwrap(),
            ],
        );
        assert_eq!(o.cache.acregmin, Duration::from_secs(10));
        assert_eq!(o.cache.acregmax, Duration::from_secs(20));
        assert_eq!(o.cache.acdirmax, Duration::from_secs(10));
        assert_eq!(o.conn.timeo, Duration::from_millis(1500));
        assert_eq!(o.conn.port, Some(1234));
        assert!(!o.conn.soft && !o.ro);
        let d = MountOptions::from_args(&t.conn, &[]);
        assert_eq!(d.cache, CacheTimes::default());
    }
}
