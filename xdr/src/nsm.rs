//! Network Status Monitor version 1 (the Open Group's XNFS specification,
//! chapter 11): how lock managers learn that a peer restarted.

/// NSM program number.
pub const PROGRAM: u32 = 100024;
/// NSM protocol version.
pub const VERSION: u32 = 1;
/// Longest host name (SM_MAXSTRLEN).
pub const SM_MAXSTRLEN: u32 = 1024;

/// NSM procedure numbers.
pub mod proc_ {
    /// NULL.
    pub const NULL: u32 = 0;
    /// SM_STAT: this host's state number (sm_name -> sm_stat_res).
    pub const STAT: u32 = 1;
    /// SM_MON: watch a host for a restart (mon -> sm_stat_res).
    pub const MON: u32 = 2;
    /// SM_UNMON: stop watching one host (mon_id -> sm_stat).
    pub const UNMON: u32 = 3;
    /// SM_UNMON_ALL: stop watching every host (my_id -> sm_stat).
    pub const UNMON_ALL: u32 = 4;
    /// SM_SIMU_CRASH: behave as after a restart (void -> void).
    pub const SIMU_CRASH: u32 = 5;
    /// SM_NOTIFY: a peer says it restarted (stat_chge -> void).
    pub const NOTIFY: u32 = 6;
}

xdr_opaque!(
    /// A host name (`string<SM_MAXSTRLEN>`).
    pub struct SmName, max = SM_MAXSTRLEN, what = "NSM host name", payload = false
);

xdr_enum!(
    /// `res`.
    #[derive(Default)]
    pub enum SmRes("sm_res") {
        /// Done.
        #[default]
        Succ = 0,
        /// Refused.
        Fail = 1,
    }
);

xdr_struct!(
    /// `sm_stat_res`: SM_STAT's and SM_MON's result.
    pub struct SmStatRes {
        /// Whether the call was done.
        pub res_stat: SmRes,
        /// This host's state number (odd while up).
        pub state: i32,
    }
);

xdr_struct!(
    /// `sm_stat`: SM_UNMON's and SM_UNMON_ALL's result.
    pub struct SmStat {
        /// This host's state number.
        pub state: i32,
    }
);

xdr_struct!(
    /// `my_id`: whom to call back when a monitored host restarts.
    pub struct MyId {
        /// The caller's host.
        pub my_name: SmName,
        /// Program to call.
        pub my_prog: i32,
        /// Its version.
        pub my_vers: i32,
        /// Its procedure.
        pub my_proc: i32,
    }
);

xdr_struct!(
    /// `mon_id`: a host to watch and whom to tell.
    pub struct MonId {
        /// The watched host.
        pub mon_name: SmName,
        /// Whom to tell.
        pub my_id: MyId,
    }
);

xdr_struct!(
    /// `mon`: SM_MON's argument.
    pub struct Mon {
        /// What to watch.
        pub mon_id: MonId,
        /// Returned to the caller in its callback.
        pub priv_: [u8; 16],
    }
);

xdr_struct!(
    /// `stat_chge`: SM_NOTIFY's argument.
    pub struct StatChge {
        /// The host that restarted.
        pub mon_name: SmName,
        /// Its new state number.
        pub state: i32,
    }
);

xdr_struct!(
    /// `status` (`sm_status` in some copies of sm_inter.x): the callback a
    /// monitor makes to `my_prog`/`my_vers`/`my_proc` of every [`MyId`]
    /// that watched a host once that host's SM_NOTIFY arrives (the Linux
    /// lock manager takes it as its private procedure 16).
    pub struct SmStatus {
        /// The host that restarted.
        pub mon_name: SmName,
        /// Its new state number.
        pub state: i32,
        /// The `priv_` given in that SM_MON call.
        pub priv_: [u8; 16],
    }
);
