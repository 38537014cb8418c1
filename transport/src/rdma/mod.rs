//! RDMA: the safe verbs layer and the completion engine built on it.
//!
//! * [`verbs`] is the only module of the project that contains `unsafe`
//!   code or calls into libibverbs / librdmacm (through `rdma-sys`).
//! * [`engine`] runs completion-queue polling threads in safe code.

#[allow(unsafe_code)]
pub mod verbs;

pub mod engine;
