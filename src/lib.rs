#![doc = include_str!(concat!(env!("OUT_DIR"), "/README-docs.md"))]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc = include_str!("../docs/attribute.md")]
pub use idempotent_macros::idempotent_job;

pub use idempotent_runtime::*;
