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
    pub fn check(self) -> Result<(), TokenStream> {
        let errors = self.errors.into_inner();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.iter().map(syn::Error::to_compile_error).collect())
        }
    }
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
