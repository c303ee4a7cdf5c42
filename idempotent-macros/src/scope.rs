//! Where the handler stands, read from its source file: an attribute macro sees only its item,
//! but the companion of a free function is a type, which cannot stand in an `impl` or `trait`
//! block, and takes the function's name among types and modules, which another item there may
//! already hold.
//!
//! The compiler tells where the handler's name was written (`Span::local_file`); that file is
//! parsed and the functions in it with the handler's name and signature are found. When every one
//! found stands in the same kind of place, that is the answer; when none is found (the handler
//! was written by a `macro_rules!` macro, the file is not on disk, the file does not parse) or
//! they disagree, the place is unknown, and the expansion does what it did without this module:
//! a companion, which a conflicting item then fails with the compiler's own error.
//!
//! Only strings cross from one expansion to the next (the parsed summary of the last file), never
//! tokens: the compiler's tokens belong to one macro call.

use std::cell::RefCell;
use std::path::PathBuf;

use quote::ToTokens as _;
use syn::{ImplItem, Item, Stmt, TraitItem};

use crate::signature::ItemFn;

/// Where a handler stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// Among items (a module or a block): a companion can stand beside it.
    Free {
        /// An item in the same scope that already takes the function's name among types and
        /// modules: its kind (`module`, `struct`, ...), so an error can name it.
        taken_by: Option<&'static str>,
    },
    /// In an `impl` or `trait` block, where a type cannot be declared.
    Associated,
    /// Not found, or found in places that disagree.
    Unknown,
}

/// One function of the file, as the summary keeps it.
#[derive(Clone, Debug)]
struct Found {
    name: String,
    signature: String,
    place: Place,
}

thread_local! {
    /// The last file read, its text and what it holds: a file with several handlers is parsed once.
    static LAST: RefCell<Option<(PathBuf, String, Vec<Found>)>> = const { RefCell::new(None) };
}

/// Where `item`, which this attribute is expanding, stands in its source file.
pub fn locate(item: &ItemFn) -> Place {
    if !proc_macro::is_available() {
        return Place::Unknown;
    }
    let Some(path) = item.sig.ident.span().unwrap().local_file() else {
        return Place::Unknown;
    };
    let Ok(source) = std::fs::read_to_string(&path) else {
        return Place::Unknown;
    };
    let name = item.sig.ident.to_string();
    let signature = item.sig.to_token_stream().to_string();
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        let fresh = !matches!(&*last, Some((p, s, _)) if *p == path && *s == source);
        if fresh {
            let found = summarise(&source).unwrap_or_default();
            *last = Some((path, source, found));
        }
        let found = last
            .as_ref()
            .map(|(_, _, found)| found.as_slice())
            .unwrap_or(&[]);
        place_of(found, &name, &signature)
    })
}

/// The one place every function of that name and signature stands in, if they agree.
fn place_of(found: &[Found], name: &str, signature: &str) -> Place {
    let mut places = found
        .iter()
        .filter(|found| found.name == name && found.signature == signature)
        .map(|found| &found.place);
    match places.next() {
        Some(first) if places.all(|other| other == first) => first.clone(),
        _ => Place::Unknown,
    }
}

/// Every function of a source file, with where it stands.
fn summarise(source: &str) -> Option<Vec<Found>> {
    let file = syn::parse_file(source).ok()?;
    let mut found = Vec::new();
    let items: Vec<&Item> = file.items.iter().collect();
    walk_items(&items, &mut found);
    Some(found)
}

fn walk_items(items: &[&Item], found: &mut Vec<Found>) {
    for item in items {
        match item {
            Item::Fn(function) => {
                found.push(Found {
                    name: function.sig.ident.to_string(),
                    signature: function.sig.to_token_stream().to_string(),
                    place: Place::Free {
                        taken_by: taken_by(items, &function.sig.ident),
                    },
                });
                walk_block(&function.block, found);
            }
            Item::Mod(module) => {
                if let Some((_, content)) = &module.content {
                    let content: Vec<&Item> = content.iter().collect();
                    walk_items(&content, found);
                }
            }
            Item::Impl(block) => {
                for item in &block.items {
                    if let ImplItem::Fn(function) = item {
                        found.push(associated(&function.sig));
                        walk_block(&function.block, found);
                    }
                }
            }
            Item::Trait(block) => {
                for item in &block.items {
                    if let TraitItem::Fn(function) = item
                        && let Some(body) = &function.default
                    {
                        found.push(associated(&function.sig));
                        walk_block(body, found);
                    }
                }
            }
            _ => {}
        }
    }
}

fn associated(signature: &syn::Signature) -> Found {
    Found {
        name: signature.ident.to_string(),
        signature: signature.to_token_stream().to_string(),
        place: Place::Associated,
    }
}

/// The items declared in a block (a function's body), which are a scope of their own.
fn walk_block(block: &syn::Block, found: &mut Vec<Found>) {
    let items: Vec<&Item> = block
        .stmts
        .iter()
        .filter_map(|stmt| match stmt {
            Stmt::Item(item) => Some(item),
            _ => None,
        })
        .collect();
    walk_items(&items, found);
}

/// The kind of the item among `items` that takes `name` among types and modules. An item under
/// `#[cfg]` may not exist in this build, so it is not counted: the compiler's own error remains
/// for it.
fn taken_by(items: &[&Item], name: &syn::Ident) -> Option<&'static str> {
    items.iter().find_map(|item| {
        let (attrs, ident, kind) = match item {
            Item::Mod(item) => (&item.attrs, &item.ident, "module"),
            Item::Struct(item) => (&item.attrs, &item.ident, "struct"),
            Item::Enum(item) => (&item.attrs, &item.ident, "enum"),
            Item::Union(item) => (&item.attrs, &item.ident, "union"),
            Item::Type(item) => (&item.attrs, &item.ident, "type alias"),
            Item::Trait(item) => (&item.attrs, &item.ident, "trait"),
            Item::TraitAlias(item) => (&item.attrs, &item.ident, "trait alias"),
            _ => return None,
        };
        let conditional = attrs
            .iter()
            .any(|attr| attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr"));
        (ident == name && !conditional).then_some(kind)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(source: &str, name: &str) -> Place {
        let found = summarise(source).expect("parses");
        let signature = found
            .iter()
            .find(|found| found.name == name)
            .map(|found| found.signature.clone())
            .expect("a function of that name");
        place_of(&found, name, &signature)
    }

    #[test]
    fn a_function_among_items_is_free() {
        assert_eq!(
            place("fn send(id: u64) {}", "send"),
            Place::Free { taken_by: None }
        );
        assert_eq!(
            place("mod m { fn main() { fn send(id: u64) {} } }", "send"),
            Place::Free { taken_by: None }
        );
    }

    #[test]
    fn a_function_in_an_impl_or_trait_is_associated() {
        assert_eq!(
            place("impl A { fn send(id: u64) {} }", "send"),
            Place::Associated
        );
        assert_eq!(
            place("trait T { fn send(id: u64) {} }", "send"),
            Place::Associated
        );
        assert_eq!(
            place(
                "mod m { impl<X> T for A<X> { fn send(id: u64) {} } }",
                "send"
            ),
            Place::Associated
        );
    }

    #[test]
    fn an_item_of_the_same_name_takes_it_in_its_own_scope_only() {
        assert_eq!(
            place("mod send {} fn send(id: u64) {}", "send"),
            Place::Free {
                taken_by: Some("module")
            }
        );
        assert_eq!(
            place("struct send; fn main() { fn send(id: u64) {} }", "send"),
            Place::Free { taken_by: None }
        );
        assert_eq!(
            place("#[cfg(test)] mod send {} fn send(id: u64) {}", "send"),
            Place::Free { taken_by: None }
        );
    }

    #[test]
    fn the_same_signature_in_two_kinds_of_place_is_unknown() {
        assert_eq!(
            place("fn send(id: u64) {} impl A { fn send(id: u64) {} }", "send"),
            Place::Unknown
        );
        assert_eq!(
            place("fn send(id: u64) {} impl A { fn send(id: i64) {} }", "send"),
            Place::Free { taken_by: None }
        );
    }
}
