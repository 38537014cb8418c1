//! RPC credentials: AUTH_SYS (uid, gid, up to 16 groups, machine name) or
//! AUTH_NONE.

use nfsrdma_xdr::rpc::{AuthSysParms, MachineName, OpaqueAuth, MAX_AUTH_SYS_GIDS};
use nfsrdma_xdr::BoundedVec;

/// AUTH_SYS parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSys {
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// Supplementary groups; only the first 16 are sent.
    pub gids: Vec<u32>,
    /// The machine name sent (at most 255 bytes are sent).
    pub machine_name: String,
}

impl AuthSys {
    /// The running process's effective uid, gid and groups (from
    /// `/proc/self/status`) and the host name (from
    /// `/proc/sys/kernel/hostname`). A process running as root sends uid 0
    /// and gid 0. Where `/proc` is not readable: uid and gid 65534
    /// (nobody) and the name `localhost`.
    pub fn current_process() -> AuthSys {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let ids = |key: &str| -> Option<Vec<u32>> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            Some(
                line[key.len()..]
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect(),
            )
        };
        // "Uid:" lists real, effective, saved and file-system ids.
        let uid = ids("Uid:").and_then(|v| v.get(1).copied()).unwrap_or(65534);
        let gid = ids("Gid:").and_then(|v| v.get(1).copied()).unwrap_or(65534);
        let gids = ids("Groups:").unwrap_or_default();
        let machine_name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "localhost".to_string());
        AuthSys {
            uid,
            gid,
            gids,
            machine_name,
        }
    }

    /// Root (uid 0, gid 0, no groups) with this host's name.
    pub fn root() -> AuthSys {
        AuthSys {
            uid: 0,
            gid: 0,
            gids: Vec::new(),
            ..AuthSys::current_process()
        }
    }

    /// The credential on the wire.
    pub fn to_opaque_auth(&self) -> OpaqueAuth {
        let mut name = self.machine_name.as_bytes().to_vec();
        name.truncate(MachineName::MAX as usize);
        let mut gids = self.gids.clone();
        gids.truncate(MAX_AUTH_SYS_GIDS as usize);
        OpaqueAuth::auth_sys(&AuthSysParms {
            stamp: 0,
            machinename: MachineName::new(name),
            uid: self.uid,
            gid: self.gid,
            gids: BoundedVec(gids),
        })
    }
}

/// The process's effective uid, from `/proc/self/status`.
pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line[4..].split_whitespace().nth(1)?.parse().ok()
}

/// The credential a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// AUTH_NONE.
    None,
    /// AUTH_SYS.
    Sys(AuthSys),
}

impl Default for Auth {
    /// AUTH_SYS with the running process's identity.
    fn default() -> Self {
        Auth::Sys(AuthSys::current_process())
    }
}

impl Auth {
    /// The flavor number.
    pub fn flavor(&self) -> u32 {
        match self {
            Auth::None => nfsrdma_xdr::rpc::flavor::AUTH_NONE,
            Auth::Sys(_) => nfsrdma_xdr::rpc::flavor::AUTH_SYS,
        }
    }

    /// The credential on the wire.
    pub fn to_opaque_auth(&self) -> OpaqueAuth {
        match self {
            Auth::None => OpaqueAuth::none(),
            Auth::Sys(s) => s.to_opaque_auth(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_names_are_cut_to_the_wire_maxima() {
        let a = AuthSys {
            uid: 1,
            gid: 2,
            gids: (0..40).collect(),
            machine_name: "x".repeat(400),
        };
        let p = a.to_opaque_auth().as_auth_sys().unwrap();
        assert_eq!(p.gids.0.len(), 16);
        assert_eq!(p.machinename.len(), 255);
        assert_eq!((p.uid, p.gid), (1, 2));
    }

    #[test]
    fn current_process_reads_proc() {
        let a = AuthSys::current_process();
        assert!(!a.machine_name.is_empty());
    }
}
