//! Devices and device contexts.

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{
    ibv_close_device, ibv_context, ibv_device, ibv_device_attr, ibv_device_cap_flags,
    ibv_free_device_list, ibv_get_device_list, ibv_get_device_name, ibv_open_device,
    ibv_query_device, rdma_free_devices, rdma_get_devices,
};

use super::cq::WcFlagsQuirk;
use super::{Result, VerbsError};

/// Vendor id the Linux Soft-RoCE driver (rxe) reports.
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

/// The RDMA devices present on this machine (`ibv_get_device_list`).
pub struct DeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

// SAFETY: the list is an immutable array of device pointers owned by this
// value; libibverbs allows using it from any thread.
unsafe impl Send for DeviceList {}

impl DeviceList {
    /// Lists the devices. Fails with [`VerbsError::NoDevice`] when the
    /// machine has no RDMA support or no device.
    pub fn new() -> Result<Self> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer for the device count.
        let list = unsafe { ibv_get_device_list(&mut n) };
        let Some(list) = NonNull::new(list) else {
            return Err(VerbsError::last_os("ibv_get_device_list"));
        };
        let this = Self {
            list,
            len: usize::try_from(n).unwrap_or(0),
        };
        if this.len == 0 {
            return Err(VerbsError::NoDevice {
                detail: "ibv_get_device_list found no devices".into(),
            });
        }
        Ok(this)
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the list is empty (never, for a list that [`Self::new`]
    /// returned).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn device(&self, index: usize) -> Option<*mut ibv_device> {
        if index >= self.len {
            return None;
        }
        // SAFETY: the array holds `len` valid entries (plus a NULL end);
        // `index < len` was checked.
        Some(unsafe { *self.list.as_ptr().add(index) })
    }

    /// Kernel names of the devices (`rxe0`, ...).
    pub fn names(&self) -> Vec<String> {
        (0..self.len)
            .filter_map(|i| self.device(i))
            .map(|d| {
                // SAFETY: `d` is a device of the live list; the returned name
                // is a NUL-terminated string owned by the device.
                let name = unsafe { ibv_get_device_name(d) };
                if name.is_null() {
                    String::new()
                } else {
                    // SAFETY: non-NULL, NUL-terminated, lives as long as the list.
                    unsafe { CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned()
                }
            })
            .collect()
    }

    /// Opens device number `index`. The context stays valid after the list
    /// is dropped.
    pub fn open(&self, index: usize) -> Result<Context> {
        let dev = self.device(index).ok_or_else(|| {
            VerbsError::InvalidArgument(format!("device index {index} of {}", self.len))
        })?;
        // SAFETY: `dev` is a device of the live list.
        let ctx = unsafe { ibv_open_device(dev) };
        let ctx = NonNull::new(ctx).ok_or_else(|| VerbsError::last_os("ibv_open_device"))?;
        Ok(Context {
            inner: Arc::new(ContextInner {
                ctx,
                owner: Owner::Opened,
            }),
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ibv_free_device_list(self.list.as_ptr()) }
    }
}

enum Owner {
    /// Opened with `ibv_open_device`; closed on drop.
    Opened,
    /// One of the contexts librdmacm opened; we hold the array returned by
    /// `rdma_get_devices`, which keeps them open until `rdma_free_devices`.
    CmDevices(NonNull<*mut ibv_context>),
}

struct ContextInner {
    ctx: NonNull<ibv_context>,
    owner: Owner,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        match self.owner {
            Owner::Opened => {
                // SAFETY: opened by us; every child holds an Arc to this
                // value, so none is left when it is dropped.
                unsafe { ibv_close_device(self.ctx.as_ptr()) };
            }
            Owner::CmDevices(list) => {
                // SAFETY: the array came from rdma_get_devices and is freed once.
                unsafe { rdma_free_devices(list.as_ptr()) };
            }
        }
    }
}

/// An open device context. Cheap to clone (reference counted).
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

// SAFETY: libibverbs contexts are thread safe; the pointer is owned by the
// Arc'd inner value and never freed while a clone exists.
unsafe impl Send for ContextInner {}
// SAFETY: as above; all verbs used on a context are thread safe.
unsafe impl Sync for ContextInner {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name())
            .finish()
    }
}

impl Context {
    /// Wraps the context librdmacm bound a CM id to.
    pub(crate) fn from_cm_verbs(verbs: *mut ibv_context) -> Result<Self> {
        if verbs.is_null() {
            return Err(VerbsError::InvalidArgument(
                "CM id is not bound to a device yet (bind or resolve an address first)".into(),
            ));
        }
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        let list = unsafe { rdma_get_devices(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| VerbsError::last_os("rdma_get_devices"))?;
        let n = usize::try_from(n).unwrap_or(0);
        // SAFETY: the array holds `n` valid context pointers.
        let found = (0..n).any(|i| unsafe { *list.as_ptr().add(i) } == verbs);
        if !found {
            // SAFETY: freeing the array we just got, once.
            unsafe { rdma_free_devices(list.as_ptr()) };
            return Err(VerbsError::InvalidArgument(
                "CM id's device is not among librdmacm's devices".into(),
            ));
        }
        Ok(Self {
            inner: Arc::new(ContextInner {
                // SAFETY-free: checked non-null above.
                ctx: NonNull::new(verbs)
                    .ok_or_else(|| VerbsError::InvalidArgument("null verbs context".into()))?,
                owner: Owner::CmDevices(list),
            }),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_context {
        self.inner.ctx.as_ptr()
    }

    /// True if both values refer to the same device context.
    pub fn same_as(&self, other: &Context) -> bool {
        self.as_ptr() == other.as_ptr()
    }

    /// The device's kernel name (`rxe0`, ...).
    pub fn name(&self) -> String {
        // SAFETY: the context is live; `device` is set by libibverbs for
        // every open context and outlives it.
        let dev = unsafe { (*self.as_ptr()).device };
        if dev.is_null() {
            return String::new();
        }
        // SAFETY: `dev` is the context's device; the name is NUL-terminated.
        let name = unsafe { ibv_get_device_name(dev) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL NUL-terminated string owned by the device.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// Queries the device attributes (`ibv_query_device`).
    pub fn query(&self) -> Result<DeviceAttrs> {
        // SAFETY: ibv_device_attr is plain old data; all-zero is valid.
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context and a valid out-pointer.
        let rc = unsafe { ibv_query_device(self.as_ptr(), &mut a) };
        if rc != 0 {
            return Err(VerbsError::errno("ibv_query_device", rc));
        }
        let fw = a.fw_ver.iter().take_while(|c| **c != 0).map(|c| *c as u8);
        let caps = ibv_device_cap_flags(a.device_cap_flags);
        let has = |f: ibv_device_cap_flags| (caps.0 & f.0) != 0;
        let nonneg = |v: libc::c_int| u32::try_from(v).unwrap_or(0);
        Ok(DeviceAttrs {
            fw_ver: String::from_utf8_lossy(&fw.collect::<Vec<u8>>()).into_owned(),
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            max_mr_size: a.max_mr_size,
            max_qp: nonneg(a.max_qp),
            max_qp_wr: nonneg(a.max_qp_wr),
            max_sge: nonneg(a.max_sge),
            max_sge_rd: nonneg(a.max_sge_rd),
            max_cq: nonneg(a.max_cq),
            max_cqe: nonneg(a.max_cqe),
            max_mr: nonneg(a.max_mr),
            max_pd: nonneg(a.max_pd),
            max_mw: nonneg(a.max_mw),
            max_srq: nonneg(a.max_srq),
            max_srq_wr: nonneg(a.max_srq_wr),
            max_srq_sge: nonneg(a.max_srq_sge),
            max_qp_rd_atom: nonneg(a.max_qp_rd_atom),
            max_qp_init_rd_atom: nonneg(a.max_qp_init_rd_atom),
            max_res_rd_atom: nonneg(a.max_res_rd_atom),
            device_cap_flags: a.device_cap_flags,
            mem_window: has(ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW),
            mem_window_type_2a: has(ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A),
            mem_window_type_2b: has(ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B),
            mem_mgt_extensions: has(ibv_device_cap_flags::IBV_DEVICE_MEM_MGT_EXTENSIONS),
            phys_port_cnt: a.phys_port_cnt,
        })
    }

    /// How receive completions of this device flag "with invalidate"
    /// (see [`WcFlagsQuirk`]). Soft-RoCE is recognised by its vendor id.
    pub fn wc_flags_quirk(&self) -> WcFlagsQuirk {
        match self.query() {
            Ok(a) if a.is_soft_roce() => WcFlagsQuirk::Rxe,
            _ => WcFlagsQuirk::Standard,
        }
    }
}

/// Device attributes (the subset this project uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttrs {
    /// Firmware version string.
    pub fw_ver: String,
    /// IEEE vendor id (`0xffffff` for Soft-RoCE).
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Largest registrable region, bytes.
    pub max_mr_size: u64,
    /// Maximum number of queue pairs.
    pub max_qp: u32,
    /// Maximum work requests per queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per send/receive work request.
    pub max_sge: u32,
    /// Maximum scatter/gather entries per RDMA Read.
    pub max_sge_rd: u32,
    /// Maximum number of completion queues.
    pub max_cq: u32,
    /// Maximum entries per completion queue.
    pub max_cqe: u32,
    /// Maximum number of memory regions.
    pub max_mr: u32,
    /// Maximum number of protection domains.
    pub max_pd: u32,
    /// Maximum number of memory windows (0: no windows; use `ibv_reg_mr`).
    pub max_mw: u32,
    /// Maximum number of shared receive queues (0: none; each queue pair
    /// then needs receives of its own).
    pub max_srq: u32,
    /// Maximum receives posted on one shared receive queue.
    pub max_srq_wr: u32,
    /// Maximum scatter/gather entries per receive on a shared queue.
    pub max_srq_sge: u32,
    /// Maximum outstanding RDMA Reads/atomics a QP can answer
    /// (bounds `responder_resources`).
    pub max_qp_rd_atom: u32,
    /// Maximum outstanding RDMA Reads/atomics a QP can issue
    /// (bounds `initiator_depth`).
    pub max_qp_init_rd_atom: u32,
    /// Maximum responder resources for the whole device.
    pub max_res_rd_atom: u32,
    /// Raw `device_cap_flags`.
    pub device_cap_flags: u32,
    /// `IBV_DEVICE_MEM_WINDOW`.
    pub mem_window: bool,
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`.
    pub mem_window_type_2a: bool,
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`.
    pub mem_window_type_2b: bool,
    /// `IBV_DEVICE_MEM_MGT_EXTENSIONS`.
    pub mem_mgt_extensions: bool,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
}

impl DeviceAttrs {
    /// True for Soft-RoCE (`rdma_rxe`), recognised by its vendor id.
    pub fn is_soft_roce(&self) -> bool {
        self.vendor_id == RXE_VENDOR_ID
    }

    /// True if type-2 memory windows can be used (2A or 2B, and at least
    /// one window).
    pub fn supports_type2_windows(&self) -> bool {
        self.max_mw > 0 && (self.mem_window_type_2a || self.mem_window_type_2b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without RDMA the list must fail with the typed
    /// no-device error; where devices exist (the VM) it must list them.
    #[test]
    fn device_list_matches_the_machine() {
        let sysfs_devices = std::fs::read_dir("/sys/class/infiniband")
            .map(|d| d.count())
            .unwrap_or(0);
        match DeviceList::new() {
            Ok(list) => {
                assert!(sysfs_devices > 0, "devices listed but none in sysfs");
                assert_eq!(list.names().len(), list.len());
            }
            Err(e) => {
                assert!(e.is_no_device(), "unexpected error: {e}");
                assert!(e.to_string().contains("tests/vm/run"), "{e}");
            }
        }
    }
}
