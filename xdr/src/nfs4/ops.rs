//! The arguments and results of the NFSv4.1 and NFSv4.2 operations this
//! crate models (RFC 5662, RFC 7863). A result is a [`Res`]: the `resok`
//! arm on NFS4_OK, the status alone otherwise; the few results with a body
//! on an error (LOCK, LOCKT, SETATTR) have their own types.

use super::{
    bad_arm, disc, Bitmap4, ChangeInfo4, Component4, Fattr4, Linktext4, LockType4, Opaque4,
    SessionId4, Specdata4, StableHow4, StateOwner4, Stateid4, Status, Time4, Utf8Str, Verifier4,
};
use crate::nfs3::Data;
use crate::{BoundedVec, Decoder, List, Result, Xdr, XdrSink};

/// An operation's result: its `resok` arm, or an error status.
pub type Res<T> = std::result::Result<T, Status>;

impl<T: Xdr> Xdr for std::result::Result<T, Status> {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            Ok(v) => {
                s.put_u32_be(0);
                v.encode(s);
            }
            Err(st) => st.encode(s),
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        let st = Status::decode(d)?;
        if st.is_ok() {
            Ok(Ok(T::decode(d)?))
        } else {
            Ok(Err(st))
        }
    }
    fn encoded_len(&self) -> usize {
        4 + self.as_ref().map_or(0, Xdr::encoded_len)
    }
}

// ---- sessions and client records ------------------------------------------

xdr_struct!(
    /// `client_owner4`.
    pub struct ClientOwner4 {
        /// Changes when the client restarts.
        pub verifier: Verifier4,
        /// The client's unique name.
        pub ownerid: Opaque4,
    }
);

xdr_struct!(
    /// `state_protect_ops4`.
    pub struct StateProtectOps4 {
        /// Operations that must use the machine credential.
        pub must_enforce: Bitmap4,
        /// Operations that may.
        pub must_allow: Bitmap4,
    }
);

/// `state_protect4_a` (SP4_SSV's parameters are not modelled: a server
/// answers it with NFS4ERR_ENCR_ALG_UNSUPP, which stops the COMPOUND at
/// that point).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum StateProtectA {
    /// SP4_NONE.
    #[default]
    None,
    /// SP4_MACH_CRED.
    MachCred(StateProtectOps4),
}

impl Xdr for StateProtectA {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            StateProtectA::None => s.put_u32_be(0),
            StateProtectA::MachCred(o) => {
                s.put_u32_be(1);
                o.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match disc(d, "state_protect_how4")? {
            0 => Ok(StateProtectA::None),
            1 => Ok(StateProtectA::MachCred(StateProtectOps4::decode(d)?)),
            v => Err(bad_arm("state_protect_how4 (SP4_SSV is not supported)", v)),
        }
    }
    fn encoded_len(&self) -> usize {
        match self {
            StateProtectA::None => 4,
            StateProtectA::MachCred(o) => 4 + o.encoded_len(),
        }
    }
}

/// `state_protect4_r`: the same shape as the arguments for SP4_NONE and
/// SP4_MACH_CRED.
pub type StateProtectR = StateProtectA;

xdr_struct!(
    /// `nfs_impl_id4`.
    pub struct NfsImplId4 {
        /// The implementer's DNS domain.
        pub domain: Utf8Str,
        /// Product name and version.
        pub name: Utf8Str,
        /// Build date.
        pub date: Time4,
    }
);

xdr_struct!(
    /// EXCHANGE_ID4args.
    pub struct ExchangeIdArgs {
        /// Who the client is.
        pub clientowner: ClientOwner4,
        /// EXCHGID4_FLAG_* bits.
        pub flags: u32,
        /// State protection asked for.
        pub state_protect: StateProtectA,
        /// The client's implementation.
        pub client_impl_id: BoundedVec<NfsImplId4, 1>,
    }
);

xdr_struct!(
    /// `server_owner4`.
    pub struct ServerOwner4 {
        /// Minor id (same major id, different minor: trunking of sessions).
        pub minor_id: u64,
        /// Major id.
        pub major_id: Opaque4,
    }
);

xdr_struct!(
    /// EXCHANGE_ID4resok.
    pub struct ExchangeIdResOk {
        /// The client id.
        pub clientid: u64,
        /// The sequence id CREATE_SESSION must carry.
        pub sequenceid: u32,
        /// EXCHGID4_FLAG_* bits.
        pub flags: u32,
        /// State protection granted.
        pub state_protect: StateProtectR,
        /// The server's owner.
        pub server_owner: ServerOwner4,
        /// The server's scope.
        pub server_scope: Opaque4,
        /// The server's implementation.
        pub server_impl_id: BoundedVec<NfsImplId4, 1>,
    }
);

xdr_struct!(
    /// `channel_attrs4`.
    pub struct ChannelAttrs4 {
        /// Header padding (RDMA).
        pub headerpadsize: u32,
        /// Largest request.
        pub maxrequestsize: u32,
        /// Largest reply.
        pub maxresponsesize: u32,
        /// Largest reply the reply cache keeps.
        pub maxresponsesize_cached: u32,
        /// Most operations in a COMPOUND.
        pub maxoperations: u32,
        /// Slots.
        pub maxrequests: u32,
        /// RDMA inbound read depth.
        pub rdma_ird: BoundedVec<u32, 1>,
    }
);

xdr_struct!(
    /// `authsys_parms` as CREATE_SESSION carries it.
    pub struct AuthSysParms {
        /// Stamp.
        pub stamp: u32,
        /// Machine name.
        pub machinename: Opaque4,
        /// User.
        pub uid: u32,
        /// Group.
        pub gid: u32,
        /// Supplementary groups.
        pub gids: BoundedVec<u32, 16>,
    }
);

xdr_struct!(
    /// `gss_cb_handles4`.
    pub struct GssCbHandles {
        /// `rpc_gss_svc_t`.
        pub service: u32,
        /// Handle from the server.
        pub handle_from_server: Opaque4,
        /// Handle from the client.
        pub handle_from_client: Opaque4,
    }
);

/// `callback_sec_parms4`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum CallbackSecParms {
    /// AUTH_NONE.
    #[default]
    None,
    /// AUTH_SYS.
    Sys(AuthSysParms),
    /// RPCSEC_GSS.
    Gss(GssCbHandles),
}

impl Xdr for CallbackSecParms {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            CallbackSecParms::None => s.put_u32_be(0),
            CallbackSecParms::Sys(p) => {
                s.put_u32_be(1);
                p.encode(s);
            }
            CallbackSecParms::Gss(g) => {
                s.put_u32_be(6);
                g.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match disc(d, "cb_secflavor")? {
            0 => Ok(CallbackSecParms::None),
            1 => Ok(CallbackSecParms::Sys(AuthSysParms::decode(d)?)),
            6 => Ok(CallbackSecParms::Gss(GssCbHandles::decode(d)?)),
            v => Err(bad_arm("cb_secflavor", v)),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            CallbackSecParms::None => 0,
            CallbackSecParms::Sys(p) => p.encoded_len(),
            CallbackSecParms::Gss(g) => g.encoded_len(),
        }
    }
}

xdr_struct!(
    /// CREATE_SESSION4args.
    pub struct CreateSessionArgs {
        /// From EXCHANGE_ID.
        pub clientid: u64,
        /// The client record's sequence.
        pub sequence: u32,
        /// CREATE_SESSION4_FLAG_* bits.
        pub flags: u32,
        /// Fore channel attributes asked for.
        pub fore_chan_attrs: ChannelAttrs4,
        /// Back channel attributes asked for.
        pub back_chan_attrs: ChannelAttrs4,
        /// The callback program.
        pub cb_program: u32,
        /// Callback security.
        pub sec_parms: BoundedVec<CallbackSecParms, 16>,
    }
);

xdr_struct!(
    /// CREATE_SESSION4resok.
    pub struct CreateSessionResOk {
        /// The session.
        pub sessionid: SessionId4,
        /// The sequence answered.
        pub sequence: u32,
        /// Flags granted.
        pub flags: u32,
        /// Fore channel attributes granted.
        pub fore_chan_attrs: ChannelAttrs4,
        /// Back channel attributes granted.
        pub back_chan_attrs: ChannelAttrs4,
    }
);

xdr_struct!(
    /// SEQUENCE4args.
    pub struct SequenceArgs {
        /// The session.
        pub sessionid: SessionId4,
        /// The slot's sequence id.
        pub sequenceid: u32,
        /// The slot.
        pub slotid: u32,
        /// The highest slot the client is using.
        pub highest_slotid: u32,
        /// Whether the reply must be cached.
        pub cachethis: bool,
    }
);

xdr_struct!(
    /// SEQUENCE4resok.
    pub struct SequenceResOk {
        /// The session.
        pub sessionid: SessionId4,
        /// The slot's sequence id.
        pub sequenceid: u32,
        /// The slot.
        pub slotid: u32,
        /// Highest slot the server will accept now.
        pub highest_slotid: u32,
        /// Highest slot the server wants the client to use.
        pub target_highest_slotid: u32,
        /// SEQ4_STATUS_* bits.
        pub status_flags: u32,
    }
);

xdr_struct!(
    /// BACKCHANNEL_CTL4args.
    pub struct BackchannelCtlArgs {
        /// The callback program.
        pub cb_program: u32,
        /// Callback security.
        pub sec_parms: BoundedVec<CallbackSecParms, 16>,
    }
);

xdr_struct!(
    /// BIND_CONN_TO_SESSION4args.
    pub struct BindConnArgs {
        /// The session.
        pub sessid: SessionId4,
        /// `channel_dir_from_client4`: 1 fore, 2 back, 3 fore or both,
        /// 7 back or both.
        pub dir: u32,
        /// RDMA mode.
        pub use_conn_in_rdma_mode: bool,
    }
);

xdr_struct!(
    /// BIND_CONN_TO_SESSION4resok.
    pub struct BindConnResOk {
        /// The session.
        pub sessid: SessionId4,
        /// `channel_dir_from_server4`: 1 fore, 2 back, 3 both.
        pub dir: u32,
        /// RDMA mode.
        pub use_conn_in_rdma_mode: bool,
    }
);

// ---- open, close, locks ---------------------------------------------------

/// `createhow4`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum CreateHow4 {
    /// UNCHECKED4.
    Unchecked(Fattr4),
    /// GUARDED4.
    Guarded(Fattr4),
    /// EXCLUSIVE4.
    Exclusive(Verifier4),
    /// EXCLUSIVE4_1: a verifier and attributes.
    Exclusive41(Verifier4, Fattr4),
}

impl Xdr for CreateHow4 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            CreateHow4::Unchecked(a) => {
                s.put_u32_be(0);
                a.encode(s);
            }
            CreateHow4::Guarded(a) => {
                s.put_u32_be(1);
                a.encode(s);
            }
            CreateHow4::Exclusive(v) => {
                s.put_u32_be(2);
                v.encode(s);
            }
            CreateHow4::Exclusive41(v, a) => {
                s.put_u32_be(3);
                v.encode(s);
                a.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match disc(d, "createmode4")? {
            0 => Ok(CreateHow4::Unchecked(Fattr4::decode(d)?)),
            1 => Ok(CreateHow4::Guarded(Fattr4::decode(d)?)),
            2 => Ok(CreateHow4::Exclusive(Verifier4::decode(d)?)),
            3 => Ok(CreateHow4::Exclusive41(
                Verifier4::decode(d)?,
                Fattr4::decode(d)?,
            )),
            v => Err(bad_arm("createmode4", v)),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            CreateHow4::Unchecked(a) | CreateHow4::Guarded(a) => a.encoded_len(),
            CreateHow4::Exclusive(_) => 8,
            CreateHow4::Exclusive41(_, a) => 8 + a.encoded_len(),
        }
    }
}

/// `open_claim4`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum OpenClaim4 {
    /// CLAIM_NULL: the name in the current (directory) handle.
    Null(Component4),
    /// CLAIM_PREVIOUS: the current handle, reclaimed after a restart,
    /// with the delegation type held.
    Previous(u32),
    /// CLAIM_DELEGATE_CUR.
    DelegateCur(Stateid4, Component4),
    /// CLAIM_DELEGATE_PREV.
    DelegatePrev(Component4),
    /// CLAIM_FH: the current handle.
    #[default]
    Fh,
    /// CLAIM_DELEG_PREV_FH.
    DelegPrevFh,
    /// CLAIM_DELEG_CUR_FH.
    DelegCurFh(Stateid4),
}

impl Xdr for OpenClaim4 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            OpenClaim4::Null(n) => {
                s.put_u32_be(0);
                n.encode(s);
            }
            OpenClaim4::Previous(t) => {
                s.put_u32_be(1);
                t.encode(s);
            }
            OpenClaim4::DelegateCur(st, n) => {
                s.put_u32_be(2);
                st.encode(s);
                n.encode(s);
            }
            OpenClaim4::DelegatePrev(n) => {
                s.put_u32_be(3);
                n.encode(s);
            }
            OpenClaim4::Fh => s.put_u32_be(4),
            OpenClaim4::DelegCurFh(st) => {
                s.put_u32_be(5);
                st.encode(s);
            }
            OpenClaim4::DelegPrevFh => s.put_u32_be(6),
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match disc(d, "open_claim_type4")? {
            0 => Ok(OpenClaim4::Null(Component4::decode(d)?)),
            1 => Ok(OpenClaim4::Previous(d.u32("open_delegation_type4")?)),
            2 => Ok(OpenClaim4::DelegateCur(
                Stateid4::decode(d)?,
                Component4::decode(d)?,
            )),
            3 => Ok(OpenClaim4::DelegatePrev(Component4::decode(d)?)),
            4 => Ok(OpenClaim4::Fh),
            5 => Ok(OpenClaim4::DelegCurFh(Stateid4::decode(d)?)),
            6 => Ok(OpenClaim4::DelegPrevFh),
            v => Err(bad_arm("open_claim_type4", v)),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            OpenClaim4::Null(n) | OpenClaim4::DelegatePrev(n) => n.encoded_len(),
            OpenClaim4::Previous(_) => 4,
            OpenClaim4::DelegateCur(_, n) => 16 + n.encoded_len(),
            OpenClaim4::Fh | OpenClaim4::DelegPrevFh => 0,
            OpenClaim4::DelegCurFh(_) => 16,
        }
    }
}

xdr_struct!(
    /// OPEN4args.
    pub struct OpenArgs {
        /// Ignored in NFSv4.1.
        pub seqid: u32,
        /// OPEN4_SHARE_ACCESS_* and want bits.
        pub share_access: u32,
        /// OPEN4_SHARE_DENY_* bits.
        pub share_deny: u32,
        /// The open owner.
        pub owner: StateOwner4,
        /// `openflag4`: `None` for OPEN4_NOCREATE.
        pub openhow: Option<CreateHow4>,
        /// What is opened.
        pub claim: OpenClaim4,
    }
);

xdr_struct!(
    /// `nfsace4`: the permissions of a delegation (RFC 8881 §6.2.1).
    pub struct Nfsace4 {
        /// `acetype4`: 0 ACCESS_ALLOWED.
        pub acetype: u32,
        /// `aceflag4`.
        pub flag: u32,
        /// `acemask4`.
        pub access_mask: u32,
        /// Whom the entry names ("" with a zero mask: nothing is said).
        pub who: Utf8Str,
    }
);

/// `nfs_space_limit4`: how far a client may write under a write
/// delegation before it must flush.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum SpaceLimit4 {
    /// NFS_LIMIT_SIZE: a file size.
    Size(u64),
    /// NFS_LIMIT_BLOCKS: blocks of a size.
    Blocks {
        /// Number of blocks.
        num_blocks: u32,
        /// Bytes per block.
        bytes_per_block: u32,
    },
}

impl Xdr for SpaceLimit4 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            SpaceLimit4::Size(n) => {
                s.put_u32_be(1);
                n.encode(s);
            }
            SpaceLimit4::Blocks {
                num_blocks,
                bytes_per_block,
            } => {
                s.put_u32_be(2);
                s.put_u32_be(*num_blocks);
                s.put_u32_be(*bytes_per_block);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match disc(d, "limit_by4")? {
            1 => Ok(SpaceLimit4::Size(u64::decode(d)?)),
            2 => Ok(SpaceLimit4::Blocks {
                num_blocks: d.u32("num_blocks")?,
                bytes_per_block: d.u32("bytes_per_block")?,
            }),
            v => Err(bad_arm("limit_by4", v)),
        }
    }
    fn encoded_len(&self) -> usize {
        match self {
            SpaceLimit4::Size(_) => 12,
            SpaceLimit4::Blocks { .. } => 12,
        }
    }
}

/// `open_delegation4`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum OpenDelegation4 {
    /// OPEN_DELEGATE_NONE.
    #[default]
    None,
    /// OPEN_DELEGATE_READ: the stateid, whether it is being recalled
    /// already, the permissions.
    Read(Stateid4, bool, Nfsace4),
    /// OPEN_DELEGATE_WRITE: as a read one, with the space limit.
    Write(Stateid4, bool, SpaceLimit4, Nfsace4),
    /// OPEN_DELEGATE_NONE_EXT with a `why_no_delegation4` that carries no
    /// arm (WND4_NOT_WANTED 0, WND4_NOT_SUPP_FTYPE 3, ...).
    NoneExt(#[cfg_attr(feature = "arbitrary", proptest(strategy = "3u32..9"))] u32),
}

impl Xdr for OpenDelegation4 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            OpenDelegation4::None => s.put_u32_be(0),
            OpenDelegation4::Read(sid, recall, ace) => {
                s.put_u32_be(1);
                sid.encode(s);
                recall.encode(s);
                ace.encode(s);
            }
            OpenDelegation4::Write(sid, recall, limit, ace) => {
                s.put_u32_be(2);
                sid.encode(s);
                recall.encode(s);
                limit.encode(s);
                ace.encode(s);
            }
            OpenDelegation4::NoneExt(why) => {
                s.put_u32_be(3);
                s.put_u32_be(*why);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match disc(d, "open_delegation_type4")? {
            0 => Ok(OpenDelegation4::None),
            1 => Ok(OpenDelegation4::Read(
                Stateid4::decode(d)?,
                bool::decode(d)?,
                Nfsace4::decode(d)?,
            )),
            2 => Ok(OpenDelegation4::Write(
                Stateid4::decode(d)?,
                bool::decode(d)?,
                SpaceLimit4::decode(d)?,
                Nfsace4::decode(d)?,
            )),
            3 => match d.u32("why_no_delegation4")? {
                w @ (1 | 2) => Err(bad_arm("why_no_delegation4 with an arm", w)),
                w => Ok(OpenDelegation4::NoneExt(w)),
            },
            v => Err(bad_arm("open_delegation_type4", v)),
        }
    }
    fn encoded_len(&self) -> usize {
        match self {
            OpenDelegation4::None => 4,
            OpenDelegation4::Read(sid, r, ace) => {
                4 + sid.encoded_len() + r.encoded_len() + ace.encoded_len()
            }
            OpenDelegation4::Write(sid, r, l, ace) => {
                4 + sid.encoded_len() + r.encoded_len() + l.encoded_len() + ace.encoded_len()
            }
            OpenDelegation4::NoneExt(_) => 8,
        }
    }
}

xdr_struct!(
    /// OPEN4resok.
    pub struct OpenResOk {
        /// The open stateid.
        pub stateid: Stateid4,
        /// The directory's change (CLAIM_NULL).
        pub cinfo: ChangeInfo4,
        /// OPEN4_RESULT_* bits.
        pub rflags: u32,
        /// Attributes set by a create.
        pub attrset: Bitmap4,
        /// The delegation granted.
        pub delegation: OpenDelegation4,
    }
);

xdr_struct!(
    /// CLOSE4args.
    pub struct CloseArgs {
        /// Ignored in NFSv4.1.
        pub seqid: u32,
        /// The open.
        pub open_stateid: Stateid4,
    }
);

xdr_struct!(
    /// OPEN_DOWNGRADE4args.
    pub struct OpenDowngradeArgs {
        /// The open.
        pub open_stateid: Stateid4,
        /// Ignored in NFSv4.1.
        pub seqid: u32,
        /// The access to keep.
        pub share_access: u32,
        /// The deny to keep.
        pub share_deny: u32,
    }
);

xdr_struct!(
    /// `open_to_lock_owner4`.
    pub struct OpenToLockOwner {
        /// Ignored in NFSv4.1.
        pub open_seqid: u32,
        /// The open the lock owner comes from.
        pub open_stateid: Stateid4,
        /// Ignored in NFSv4.1.
        pub lock_seqid: u32,
        /// The new lock owner.
        pub lock_owner: StateOwner4,
    }
);

xdr_struct!(
    /// `exist_lock_owner4`.
    pub struct ExistLockOwner {
        /// The lock owner's stateid.
        pub lock_stateid: Stateid4,
        /// Ignored in NFSv4.1.
        pub lock_seqid: u32,
    }
);

/// `locker4`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum Locker4 {
    /// A lock owner new to the server.
    New(OpenToLockOwner),
    /// A lock owner with a stateid.
    Existing(ExistLockOwner),
}

impl Default for Locker4 {
    fn default() -> Self {
        Locker4::Existing(ExistLockOwner::default())
    }
}

impl Xdr for Locker4 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            Locker4::New(o) => {
                s.put_u32_be(1);
                o.encode(s);
            }
            Locker4::Existing(e) => {
                s.put_u32_be(0);
                e.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        if d.bool("new_lock_owner")? {
            Ok(Locker4::New(OpenToLockOwner::decode(d)?))
        } else {
            Ok(Locker4::Existing(ExistLockOwner::decode(d)?))
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            Locker4::New(o) => o.encoded_len(),
            Locker4::Existing(e) => e.encoded_len(),
        }
    }
}

xdr_struct!(
    /// LOCK4args.
    pub struct LockArgs {
        /// The lock's type.
        pub locktype: LockType4,
        /// A reclaim after a restart.
        pub reclaim: bool,
        /// First byte.
        pub offset: u64,
        /// Bytes (all ones: to the end).
        pub length: u64,
        /// Who locks.
        pub locker: Locker4,
    }
);

xdr_struct!(
    /// LOCK4denied.
    pub struct LockDenied {
        /// The conflicting lock's first byte.
        pub offset: u64,
        /// Its length.
        pub length: u64,
        /// Its type.
        pub locktype: LockType4,
        /// Its owner.
        pub owner: StateOwner4,
    }
);

/// LOCK4res and LOCKT4res: granted (LOCK's stateid), denied with the
/// conflicting lock, or another error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum LockRes<T> {
    /// NFS4_OK.
    Ok(T),
    /// NFS4ERR_DENIED.
    Denied(LockDenied),
    /// Any other error.
    Err(Status),
}

impl<T> LockRes<T> {
    /// The status on the wire.
    pub fn status(&self) -> Status {
        match self {
            LockRes::Ok(_) => Status::OK,
            LockRes::Denied(_) => Status::DENIED,
            LockRes::Err(s) => *s,
        }
    }
}

impl<T: Xdr> Xdr for LockRes<T> {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        self.status().encode(s);
        match self {
            LockRes::Ok(v) => v.encode(s),
            LockRes::Denied(dn) => dn.encode(s),
            LockRes::Err(_) => {}
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match Status::decode(d)? {
            Status::OK => Ok(LockRes::Ok(T::decode(d)?)),
            Status::DENIED => Ok(LockRes::Denied(LockDenied::decode(d)?)),
            s => Ok(LockRes::Err(s)),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            LockRes::Ok(v) => v.encoded_len(),
            LockRes::Denied(dn) => dn.encoded_len(),
            LockRes::Err(_) => 0,
        }
    }
}

xdr_struct!(
    /// LOCKT4args.
    pub struct LocktArgs {
        /// The type tested.
        pub locktype: LockType4,
        /// First byte.
        pub offset: u64,
        /// Bytes.
        pub length: u64,
        /// The owner testing (its own locks never conflict).
        pub owner: StateOwner4,
    }
);

xdr_struct!(
    /// LOCKU4args.
    pub struct LockuArgs {
        /// The type (ignored).
        pub locktype: LockType4,
        /// Ignored in NFSv4.1.
        pub seqid: u32,
        /// The lock owner's stateid.
        pub lock_stateid: Stateid4,
        /// First byte.
        pub offset: u64,
        /// Bytes.
        pub length: u64,
    }
);

// ---- file and directory operations ------------------------------------------

xdr_struct!(
    /// ACCESS4resok.
    pub struct AccessResOk {
        /// The bits the server could check.
        pub supported: u32,
        /// The bits allowed.
        pub access: u32,
    }
);

xdr_struct!(
    /// COMMIT4args.
    pub struct CommitArgs {
        /// First byte.
        pub offset: u64,
        /// Bytes (0: to the end).
        pub count: u32,
    }
);

/// `createtype4`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum CreateType4 {
    /// A symbolic link with its text.
    Link(Linktext4),
    /// A block device.
    Blk(Specdata4),
    /// A character device.
    Chr(Specdata4),
    /// A socket.
    Sock,
    /// A fifo.
    Fifo,
    /// A directory.
    #[default]
    Dir,
    /// Another type (REG, ATTRDIR, NAMEDATTR): NFS4ERR_BADTYPE.
    Other(#[cfg_attr(feature = "arbitrary", proptest(strategy = "8u32..100"))] u32),
}

impl Xdr for CreateType4 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            CreateType4::Link(l) => {
                s.put_u32_be(5);
                l.encode(s);
            }
            CreateType4::Blk(sp) => {
                s.put_u32_be(3);
                sp.encode(s);
            }
            CreateType4::Chr(sp) => {
                s.put_u32_be(4);
                sp.encode(s);
            }
            CreateType4::Sock => s.put_u32_be(6),
            CreateType4::Fifo => s.put_u32_be(7),
            CreateType4::Dir => s.put_u32_be(2),
            CreateType4::Other(t) => s.put_u32_be(*t),
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        Ok(match disc(d, "nfs_ftype4")? {
            5 => CreateType4::Link(Linktext4::decode(d)?),
            3 => CreateType4::Blk(Specdata4::decode(d)?),
            4 => CreateType4::Chr(Specdata4::decode(d)?),
            6 => CreateType4::Sock,
            7 => CreateType4::Fifo,
            2 => CreateType4::Dir,
            t => CreateType4::Other(t),
        })
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            CreateType4::Link(l) => l.encoded_len(),
            CreateType4::Blk(_) | CreateType4::Chr(_) => 8,
            _ => 0,
        }
    }
}

xdr_struct!(
    /// CREATE4args.
    pub struct CreateArgs {
        /// What to make.
        pub objtype: CreateType4,
        /// Its name.
        pub objname: Component4,
        /// Its attributes.
        pub createattrs: Fattr4,
    }
);

xdr_struct!(
    /// CREATE4resok.
    pub struct CreateResOk {
        /// The directory's change.
        pub cinfo: ChangeInfo4,
        /// Attributes set.
        pub attrset: Bitmap4,
    }
);

xdr_struct!(
    /// READ4args.
    pub struct ReadArgs {
        /// The open, lock or special stateid.
        pub stateid: Stateid4,
        /// First byte.
        pub offset: u64,
        /// Bytes.
        pub count: u32,
    }
);

xdr_struct!(
    /// READ4resok.
    pub struct ReadResOk {
        /// The end of the file was reached.
        pub eof: bool,
        /// The data (DDP-eligible).
        pub data: Data,
    }
);

xdr_struct!(
    /// WRITE4args.
    pub struct WriteArgs {
        /// The open, lock or special stateid.
        pub stateid: Stateid4,
        /// First byte.
        pub offset: u64,
        /// How stable the data must be when the reply is sent.
        pub stable: StableHow4,
        /// The data (DDP-eligible).
        pub data: Data,
    }
);

xdr_struct!(
    /// WRITE4resok.
    pub struct WriteResOk {
        /// Bytes written.
        pub count: u32,
        /// How stable they are.
        pub committed: StableHow4,
        /// The write verifier.
        pub writeverf: Verifier4,
    }
);

xdr_struct!(
    /// READDIR4args.
    pub struct ReaddirArgs {
        /// Where to continue (0: from the start).
        pub cookie: u64,
        /// The verifier that came with the cookie.
        pub cookieverf: Verifier4,
        /// Bytes of names and cookies wanted.
        pub dircount: u32,
        /// Largest reply.
        pub maxcount: u32,
        /// Attributes wanted per entry.
        pub attr_request: Bitmap4,
    }
);

xdr_struct!(
    /// `entry4` (without the link).
    pub struct Entry4 {
        /// Where to continue after it.
        pub cookie: u64,
        /// Its name.
        pub name: Component4,
        /// Its attributes.
        pub attrs: Fattr4,
    }
);

xdr_struct!(
    /// READDIR4resok.
    pub struct ReaddirResOk {
        /// The directory's cookie verifier.
        pub cookieverf: Verifier4,
        /// The entries.
        pub entries: List<Entry4>,
        /// Whether the listing is complete.
        pub eof: bool,
    }
);

xdr_struct!(
    /// RENAME4args.
    pub struct RenameArgs {
        /// The name in the saved handle's directory.
        pub oldname: Component4,
        /// The name in the current handle's directory.
        pub newname: Component4,
    }
);

xdr_struct!(
    /// RENAME4resok.
    pub struct RenameResOk {
        /// The source directory's change.
        pub source_cinfo: ChangeInfo4,
        /// The target directory's change.
        pub target_cinfo: ChangeInfo4,
    }
);

xdr_struct!(
    /// RPCSEC_GSS's arm of `secinfo4`.
    pub struct RpcsecGssInfo {
        /// The mechanism's OID.
        pub oid: Opaque4,
        /// Quality of protection.
        pub qop: u32,
        /// `rpc_gss_svc_t`.
        pub service: u32,
    }
);

/// `secinfo4`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum SecInfo4 {
    /// A flavor with no parameters (AUTH_NONE 0, AUTH_SYS 1).
    Flavor(#[cfg_attr(feature = "arbitrary", proptest(strategy = "0u32..6"))] u32),
    /// RPCSEC_GSS (6).
    Gss(RpcsecGssInfo),
}

impl Xdr for SecInfo4 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            SecInfo4::Flavor(f) => s.put_u32_be(*f),
            SecInfo4::Gss(g) => {
                s.put_u32_be(6);
                g.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match d.u32("flavor")? {
            6 => Ok(SecInfo4::Gss(RpcsecGssInfo::decode(d)?)),
            f => Ok(SecInfo4::Flavor(f)),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            SecInfo4::Flavor(_) => 0,
            SecInfo4::Gss(g) => g.encoded_len(),
        }
    }
}

/// SECINFO4resok and SECINFO_NO_NAME4resok.
pub type SecInfoList = BoundedVec<SecInfo4, 16>;

xdr_struct!(
    /// SETATTR4args.
    pub struct SetattrArgs {
        /// The open stateid for a size change (or a special one).
        pub stateid: Stateid4,
        /// The attributes.
        pub obj_attributes: Fattr4,
    }
);

xdr_struct!(
    /// SETATTR4res: the mask of what was set comes also with an error.
    pub struct SetattrRes {
        /// The status.
        pub status: Status,
        /// Attributes set.
        pub attrsset: Bitmap4,
    }
);

// ---- NFSv4.2 ----------------------------------------------------------------

xdr_struct!(
    /// ALLOCATE4args and DEALLOCATE4args.
    pub struct SpaceArgs {
        /// The open stateid.
        pub stateid: Stateid4,
        /// First byte.
        pub offset: u64,
        /// Bytes.
        pub length: u64,
    }
);

/// `netloc4`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum Netloc4 {
    /// NL4_NAME.
    Name(Utf8Str),
    /// NL4_URL.
    Url(Utf8Str),
    /// NL4_NETADDR: netid and universal address.
    NetAddr(Utf8Str, Utf8Str),
}

impl Default for Netloc4 {
    fn default() -> Self {
        Netloc4::Name(Utf8Str::default())
    }
}

impl Xdr for Netloc4 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            Netloc4::Name(n) => {
                s.put_u32_be(1);
                n.encode(s);
            }
            Netloc4::Url(u) => {
                s.put_u32_be(2);
                u.encode(s);
            }
            Netloc4::NetAddr(id, a) => {
                s.put_u32_be(3);
                id.encode(s);
                a.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match disc(d, "netloc_type4")? {
            1 => Ok(Netloc4::Name(Utf8Str::decode(d)?)),
            2 => Ok(Netloc4::Url(Utf8Str::decode(d)?)),
            3 => Ok(Netloc4::NetAddr(Utf8Str::decode(d)?, Utf8Str::decode(d)?)),
            v => Err(bad_arm("netloc_type4", v)),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            Netloc4::Name(n) | Netloc4::Url(n) => n.encoded_len(),
            Netloc4::NetAddr(id, a) => id.encoded_len() + a.encoded_len(),
        }
    }
}

xdr_struct!(
    /// COPY4args.
    pub struct CopyArgs {
        /// Source stateid.
        pub src_stateid: Stateid4,
        /// Destination stateid.
        pub dst_stateid: Stateid4,
        /// Source offset.
        pub src_offset: u64,
        /// Destination offset.
        pub dst_offset: u64,
        /// Bytes (0: to the source's end).
        pub count: u64,
        /// Consecutive copy wanted.
        pub consecutive: bool,
        /// Synchronous copy wanted.
        pub synchronous: bool,
        /// Other servers holding the source (inter-server copy).
        pub source_server: BoundedVec<Netloc4, 16>,
    }
);

xdr_struct!(
    /// `write_response4`.
    pub struct WriteResponse4 {
        /// The offload's stateid (asynchronous copies).
        pub callback_id: BoundedVec<Stateid4, 1>,
        /// Bytes copied.
        pub count: u64,
        /// How stable they are.
        pub committed: StableHow4,
        /// The write verifier.
        pub writeverf: Verifier4,
    }
);

xdr_struct!(
    /// COPY4resok.
    pub struct CopyResOk {
        /// What was written.
        pub response: WriteResponse4,
        /// `copy_requirements4`: consecutive.
        pub consecutive: bool,
        /// `copy_requirements4`: synchronous.
        pub synchronous: bool,
    }
);

xdr_struct!(
    /// CLONE4args.
    pub struct CloneArgs {
        /// Source stateid.
        pub src_stateid: Stateid4,
        /// Destination stateid.
        pub dst_stateid: Stateid4,
        /// Source offset.
        pub src_offset: u64,
        /// Destination offset.
        pub dst_offset: u64,
        /// Bytes (0: to the source's end).
        pub count: u64,
    }
);

xdr_struct!(
    /// SEEK4args.
    pub struct SeekArgs {
        /// The stateid.
        pub stateid: Stateid4,
        /// Where to start.
        pub offset: u64,
        /// `data_content4`: NFS4_CONTENT_DATA 0, NFS4_CONTENT_HOLE 1.
        pub what: u32,
    }
);

xdr_struct!(
    /// SEEK4resok.
    pub struct SeekResOk {
        /// Nothing was found before the end.
        pub eof: bool,
        /// Where the data or hole starts.
        pub offset: u64,
    }
);
