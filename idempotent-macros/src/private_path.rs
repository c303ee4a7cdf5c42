//! The name of the runtime's module for generated code, shared by the expansion and the errors
//! (`ctxt`), which reach `compile_error!` through it.

use proc_macro2::{Ident, Span};
use quote::format_ident;

/// The runtime's private module for generated code, named with this crate's version (which the
/// facade pins exactly), spanned at `span`.
pub fn private_module_at(span: Span) -> Ident {
    format_ident!(
        "__private_{}",
        env!("CARGO_PKG_VERSION").replace(['.', '-', '+'], "_"),
        span = span
    )
}
