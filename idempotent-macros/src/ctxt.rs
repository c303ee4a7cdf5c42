//! One error context per attribute: every step records its errors here, and nothing is expanded
//! until the context has been checked, so a user with three mistakes fixes them in one build.

use std::cell::RefCell;

use proc_macro2::TokenStream;

/// The errors of one `#[idempotent_job]`, collected across parsing and checking.
#[derive(Default)]
pub struct Ctxt {
    errors: RefCell<Vec<syn::Error>>,
}

impl Ctxt {
    /// Records an error; parsing and checking go on, to find the others.
    pub fn error(&self, error: syn::Error) {
        self.errors.borrow_mut().push(error);
    }

    /// Records an error at `span`.
    pub fn error_at(&self, span: proc_macro2::Span, message: impl std::fmt::Display) {
        self.error(syn::Error::new(span, message));
    }

    /// `Ok` when nothing was recorded; otherwise every error, as `compile_error!`s.
    #[cfg(test)]
    pub fn check(self) -> Result<(), TokenStream> {
        self.check_in(None)
    }

    /// [`check`](Self::check), the `compile_error!`s reached through the runtime at `krate`
    /// (the attribute's `crate = ...`; `::idempotent_jobs` where there is none):
    /// `::core::compile_error!`, as syn writes it, spanned at the user's tokens, does not resolve
    /// in an edition 2015 crate without `extern crate core;`, and every error read "cannot find
    /// `core` in the crate root". The runtime, which a 2015 crate names with `extern crate`,
    /// re-exports the macro.
    pub fn check_in(self, krate: Option<&syn::Path>) -> Result<(), TokenStream> {
        let errors = self.errors.into_inner();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors
                .iter()
                .map(|error| through_runtime(error.to_compile_error(), krate))
                .collect())
        }
    }
}

/// syn's `::core::compile_error! { ... }` as `<krate>::<private>::compile_error! { ... }`, the
/// path spanned where `core` was, every other token as syn spanned it (where each error points).
fn through_runtime(tokens: TokenStream, krate: Option<&syn::Path>) -> TokenStream {
    use quote::ToTokens as _;
    let mut out = TokenStream::new();
    let mut tokens = tokens.into_iter().peekable();
    let mut leading = Vec::new();
    while let Some(token) = tokens.next() {
        match token {
            proc_macro2::TokenTree::Ident(ident) if ident == "core" => {
                let span = ident.span();
                let private = crate::private_path::private_module_at(span);
                let path = match krate {
                    Some(path) => {
                        let mut path = path.to_token_stream();
                        path = path
                            .into_iter()
                            .map(|mut token| {
                                token.set_span(span);
                                token
                            })
                            .collect();
                        quote::quote_spanned!(span=> #path :: #private)
                    }
                    None => {
                        out.extend(leading.drain(..));
                        quote::quote_spanned!(span=> idempotent_jobs :: #private)
                    }
                };
                leading.clear();
                out.extend(path);
                out.extend(tokens.by_ref());
                return out;
            }
            // The leading `::`, kept for `::idempotent_jobs`, dropped before a path of the user's.
            other => leading.push(other),
        }
    }
    out.extend(leading);
    out
}

/// The candidate closest to `name`, if it is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .filter(|candidate| *candidate != name)
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|(distance, candidate)| {
            let longest = name.chars().count().max(candidate.chars().count());
            *distance <= 2.max(longest / 3)
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance, counting in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let params = ["month", "customer_id"];
        assert_eq!(did_you_mean("custmer_id", params), Some("customer_id"));
        assert_eq!(did_you_mean("mnth", params), Some("month"));
        assert_eq!(did_you_mean("amount", params), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn every_error_is_reported() {
        let cx = Ctxt::default();
        cx.error_at(proc_macro2::Span::call_site(), "one");
        cx.error_at(proc_macro2::Span::call_site(), "two");
        let errors = cx.check().expect_err("two errors").to_string();
        assert!(errors.contains("one") && errors.contains("two"), "{errors}");
        assert!(Ctxt::default().check().is_ok());
    }
}
