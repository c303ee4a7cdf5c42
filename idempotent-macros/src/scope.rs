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
        /// modules: its kind (`a module`, `an import`, ...), so an error can name it.
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
    /// Where its name starts: line (from 1) and column (in characters, from 0).
    at: (usize, usize),
    place: Place,
}

/// A block of the file: the braces of an `impl` or `trait` block (`Associated`), or of a function's
/// body, a module or a block expression (`Free`).
#[derive(Clone, Debug)]
struct Region {
    start: (usize, usize),
    end: (usize, usize),
    place: Place,
}

/// Whether code of a function's scope names the function's name as the root of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rooted {
    /// No.
    No,
    /// Yes: a crate's, unless an item of the file binds the name.
    ByPath,
    /// Yes, and no item of the scope binds it where a glob import may bring it: the glob's.
    ThroughGlob,
}

/// What a source file holds.
#[derive(Clone, Debug, Default)]
struct Summary {
    functions: Vec<Found>,
    regions: Vec<Region>,
    /// For each function of `functions` (same index): whether code of its scope names its name as
    /// the root of a path (`url::Url::parse`), other than to its companion.
    rooted: Vec<Rooted>,
    /// Every name a `use`, `mod` or `extern crate` of the file binds, at any depth: a path rooted
    /// there may reach that, not a crate.
    bound: std::collections::HashSet<String>,
    /// The names of `bound` that a block binds (a `use` or `mod` in a function's body).
    block_bound: std::collections::HashSet<String>,
}

thread_local! {
    /// The last file read, its text and what it holds: a file with several handlers is parsed once.
    static LAST: RefCell<Option<(PathBuf, String, Summary)>> = const { RefCell::new(None) };
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
    let start = item.sig.ident.span().start();
    let at = (start.line, start.column);
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        let fresh = !matches!(&*last, Some((p, s, _)) if *p == path && *s == source);
        if fresh {
            let summary = summarise(&source).unwrap_or_default();
            *last = Some((path, source, summary));
        }
        match last.as_ref() {
            Some((_, _, summary)) => place_of(summary, &name, &signature, at),
            None => Place::Unknown,
        }
    })
}

/// The place of the function whose name starts at `at`; for one not found there (made by a
/// macro), the one place every function of that name and signature stands in, if they agree, or
/// else the place of the innermost block around `at` if that is an `impl` or `trait` block (the
/// name was passed to a macro there).
fn place_of(summary: &Summary, name: &str, signature: &str, at: (usize, usize)) -> Place {
    if let Some(found) = summary
        .functions
        .iter()
        .find(|found| found.name == name && found.at == at)
    {
        return found.place.clone();
    }
    let mut places = summary
        .functions
        .iter()
        .filter(|found| found.name == name && found.signature == signature)
        .map(|found| &found.place);
    if let Some(first) = places.next() {
        return if places.all(|other| other == first) {
            first.clone()
        } else {
            Place::Unknown
        };
    }
    let innermost = summary
        .regions
        .iter()
        .filter(|region| region.start < at && at < region.end)
        .max_by_key(|region| region.start);
    match innermost {
        Some(Region {
            place: Place::Associated,
            ..
        }) => Place::Associated,
        _ => Place::Unknown,
    }
}

/// Every function of a source file, with where it stands, and its blocks. The file is parsed by
/// proc-macro2's own parser, whose spans know their lines and columns (the compiler's, for a
/// string, would all be the macro call's).
fn summarise(source: &str) -> Option<Summary> {
    struct Fallback;
    impl Drop for Fallback {
        fn drop(&mut self) {
            proc_macro2::fallback::unforce();
        }
    }
    proc_macro2::fallback::force();
    let _fallback = Fallback;
    let file = syn::parse_file(source).ok()?;
    let mut summary = Summary::default();
    let items: Vec<&Item> = file.items.iter().collect();
    walk_items(&items, &mut summary);
    for (found, rooted) in summary.functions.iter_mut().zip(&summary.rooted) {
        let taken = match rooted {
            Rooted::No => false,
            Rooted::ByPath => !summary.bound.contains(&found.name),
            // A block's own `use` may bind it where the path is.
            Rooted::ThroughGlob => !summary.block_bound.contains(&found.name),
        };
        if taken && found.place == (Place::Free { taken_by: None }) {
            found.place = Place::Free {
                taken_by: Some(CRATE_IN_A_PATH),
            };
        }
    }
    Some(summary)
}

fn position(span: proc_macro2::Span) -> (usize, usize) {
    let start = span.start();
    (start.line, start.column)
}

fn region(summary: &mut Summary, braces: &syn::token::Brace, place: Place) {
    let span = braces.span;
    summary.regions.push(Region {
        start: position(span.open()),
        end: position(span.close()),
        place,
    });
}

fn walk_items(items: &[&Item], summary: &mut Summary) {
    let roots = path_roots(items);
    // A name that starts a path here and that no item of this scope binds, where a glob import
    // (`use super::*;`) may bring it, is the glob's: bound elsewhere in the file (a module of
    // the parent's) is no binding here, and the companion, an item of this scope, would hide it.
    let mut own = std::collections::HashSet::new();
    for item in items {
        bind_names(item, &mut own);
    }
    let globbed = items.iter().any(|item| is_glob_import(item));
    for item in items {
        bind_names(item, &mut summary.bound);
        match item {
            Item::Fn(function) => {
                summary.functions.push(Found {
                    name: function.sig.ident.to_string(),
                    signature: function.sig.to_token_stream().to_string(),
                    at: position(function.sig.ident.span()),
                    place: Place::Free {
                        taken_by: taken_by(items, &function.sig.ident),
                    },
                });
                let name = function.sig.ident.to_string();
                summary.rooted.push(match roots.contains(&name) {
                    false => Rooted::No,
                    true if globbed && !own.contains(&name) => Rooted::ThroughGlob,
                    true => Rooted::ByPath,
                });
                walk_block(&function.block, summary);
            }
            Item::Mod(module) => {
                if let Some((braces, content)) = &module.content {
                    region(summary, braces, Place::Free { taken_by: None });
                    let content: Vec<&Item> = content.iter().collect();
                    walk_items(&content, summary);
                }
            }
            Item::Impl(block) => {
                region(summary, &block.brace_token, Place::Associated);
                for item in &block.items {
                    if let ImplItem::Fn(function) = item {
                        summary.functions.push(associated(&function.sig));
                        summary.rooted.push(Rooted::No);
                        walk_block(&function.block, summary);
                    }
                }
            }
            Item::Trait(block) => {
                region(summary, &block.brace_token, Place::Associated);
                for item in &block.items {
                    if let TraitItem::Fn(function) = item
                        && let Some(body) = &function.default
                    {
                        summary.functions.push(associated(&function.sig));
                        summary.rooted.push(Rooted::No);
                        walk_block(body, summary);
                    }
                }
            }
            // `const _: () = { impl A { .. } };`
            Item::Const(constant) => walk_expr(&constant.expr, summary),
            Item::Static(statik) => walk_expr(&statik.expr, summary),
            // `cfg_if! { if #[cfg(unix)] { impl A { .. } } }`
            Item::Macro(call) => walk_macro(&call.mac.tokens, summary),
            _ => {}
        }
    }
}

fn associated(signature: &syn::Signature) -> Found {
    Found {
        name: signature.ident.to_string(),
        signature: signature.to_token_stream().to_string(),
        at: position(signature.ident.span()),
        place: Place::Associated,
    }
}

/// The items declared in a block (a function's body), which are a scope of their own, and those
/// of the blocks inside it.
fn walk_block(block: &syn::Block, summary: &mut Summary) {
    region(summary, &block.brace_token, Place::Free { taken_by: None });
    let items: Vec<&Item> = block
        .stmts
        .iter()
        .filter_map(|stmt| match stmt {
            Stmt::Item(item) => Some(item),
            _ => None,
        })
        .collect();
    for item in &items {
        bind_names(item, &mut summary.block_bound);
    }
    walk_items(&items, summary);
    for stmt in &block.stmts {
        match stmt {
            Stmt::Local(local) => {
                if let Some(init) = &local.init {
                    walk_expr(&init.expr, summary);
                    if let Some((_, diverge)) = &init.diverge {
                        walk_expr(diverge, summary);
                    }
                }
            }
            Stmt::Expr(expr, _) => walk_expr(expr, summary),
            Stmt::Macro(call) => walk_macro(&call.mac.tokens, summary),
            Stmt::Item(_) => {}
        }
    }
}

/// The blocks of an expression that can hold items (those of nested expressions that are not
/// blocks are not looked into: a handler there is found by the name and signature).
fn walk_expr(expr: &syn::Expr, summary: &mut Summary) {
    use syn::Expr;
    match expr {
        Expr::Block(block) => walk_block(&block.block, summary),
        Expr::Unsafe(block) => walk_block(&block.block, summary),
        Expr::Const(block) => walk_block(&block.block, summary),
        Expr::Async(block) => walk_block(&block.block, summary),
        Expr::Loop(block) => walk_block(&block.body, summary),
        Expr::While(block) => walk_block(&block.body, summary),
        Expr::ForLoop(block) => walk_block(&block.body, summary),
        Expr::If(branch) => {
            walk_block(&branch.then_branch, summary);
            if let Some((_, otherwise)) = &branch.else_branch {
                walk_expr(otherwise, summary);
            }
        }
        Expr::Closure(closure) => walk_expr(&closure.body, summary),
        // `thread::spawn(move || { impl A { .. } })`
        Expr::Call(call) => call.args.iter().for_each(|arg| walk_expr(arg, summary)),
        Expr::MethodCall(call) => {
            walk_expr(&call.receiver, summary);
            call.args.iter().for_each(|arg| walk_expr(arg, summary));
        }
        Expr::Paren(inner) => walk_expr(&inner.expr, summary),
        Expr::Macro(call) => walk_macro(&call.mac.tokens, summary),
        Expr::Match(matched) => {
            for arm in &matched.arms {
                walk_expr(&arm.body, summary);
            }
        }
        _ => {}
    }
}

/// The items a macro call's tokens hold, where they read as items (`cfg_if!`'s branches, a
/// `tokio::select!` arm's block): the tokens themselves, or else each group of braces inside them.
/// Tokens that are not Rust until the macro expands them (a `macro_rules!` definition's `$name`s)
/// are not read: a handler there is found by the name and signature, or its place is unknown.
fn walk_macro(tokens: &proc_macro2::TokenStream, summary: &mut Summary) {
    if let Ok(file) = syn::parse2::<syn::File>(tokens.clone()) {
        let items: Vec<&Item> = file.items.iter().collect();
        walk_items(&items, summary);
        return;
    }
    for tree in tokens.clone() {
        if let proc_macro2::TokenTree::Group(group) = tree {
            if group.delimiter() == proc_macro2::Delimiter::Brace
                && let Ok(block) = syn::parse2::<syn::Block>(group.to_token_stream())
            {
                walk_block(&block, summary);
                continue;
            }
            walk_macro(&group.stream(), summary);
        }
    }
}

/// The kind of the item among `items` that takes `name` among types and modules, with its article
/// (`a module`, `an import`). An item under `#[cfg]` may not exist in this build, so it is not
/// counted: the compiler's own error remains for it. An import counts when it names `name` (by
/// its last segment, an `as` or a `{self}`), whatever namespace the imported item is in: a type or
/// a module conflicts with the companion, and a function with the handler itself.
fn taken_by(items: &[&Item], name: &syn::Ident) -> Option<&'static str> {
    declared(items, name)
}

/// What takes a function's name when code of its module reaches a crate of that name by a path.
pub const CRATE_IN_A_PATH: &str =
    "a crate (or a module a glob import brings) that code in this module names in a path";

/// The names that start a path in `items` and go on past it to something other than a
/// companion's own `key`, `job` and `outcome` (`metrics::counter!`, `url::Url::parse`): a name
/// no item of the file binds is a crate's (or a glob import's), which a companion of that name
/// would hide. Items of nested modules are not looked into (they do not see the companion), nor
/// items under `#[cfg]` (they may not exist in this build), nor a macro's `$name` or `quote!`'s
/// `#name`.
fn path_roots(items: &[&Item]) -> std::collections::HashSet<String> {
    let mut roots = std::collections::HashSet::new();
    for item in items {
        if matches!(item, Item::Mod(_)) || conditional(item) {
            continue;
        }
        collect_roots(item.to_token_stream(), &mut roots);
    }
    roots
}

/// Whether `item` is under `#[cfg]` (or `#[cfg_attr]`).
fn conditional(item: &Item) -> bool {
    let attrs: &[syn::Attribute] = match item {
        Item::Fn(item) => &item.attrs,
        Item::Impl(item) => &item.attrs,
        Item::Const(item) => &item.attrs,
        Item::Static(item) => &item.attrs,
        Item::Struct(item) => &item.attrs,
        Item::Enum(item) => &item.attrs,
        Item::Trait(item) => &item.attrs,
        Item::Macro(item) => &item.attrs,
        Item::Type(item) => &item.attrs,
        _ => &[],
    };
    attrs
        .iter()
        .any(|attr| attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr"))
}

/// [`path_roots`] of one token stream, into `roots`.
fn collect_roots(tokens: proc_macro2::TokenStream, roots: &mut std::collections::HashSet<String>) {
    use proc_macro2::TokenTree;
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let punct = |at: Option<usize>, c: char| matches!(at.and_then(|at| trees.get(at)), Some(TokenTree::Punct(p)) if p.as_char() == c);
    for (i, tree) in trees.iter().enumerate() {
        match tree {
            TokenTree::Group(group) => collect_roots(group.stream(), roots),
            TokenTree::Ident(ident) => {
                let before = |back: usize| i.checked_sub(back);
                // Not `a::name`, `$name` nor `#name`.
                let after_separator = punct(before(1), ':') && punct(before(2), ':');
                let interpolated = punct(before(1), '$') || punct(before(1), '#');
                let rooted = !(after_separator || interpolated);
                let continues = punct(Some(i + 1), ':')
                    && punct(Some(i + 2), ':')
                    && matches!(trees.get(i + 3), Some(TokenTree::Ident(next))
                        if !["key", "job", "outcome"].iter().any(|own| next == own));
                if rooted && continues {
                    roots.insert(syn::ext::IdentExt::unraw(ident).to_string());
                }
            }
            _ => {}
        }
    }
}

/// Adds the names `item` binds by a `use`, a `mod` or an `extern crate`, and those of the items
/// inside it at any depth, to `bound`.
/// Whether `item` is a glob import (`use super::*;`, `use crate::{a::*, b}`).
fn is_glob_import(item: &Item) -> bool {
    fn glob(tree: &syn::UseTree) -> bool {
        match tree {
            syn::UseTree::Path(path) => glob(&path.tree),
            syn::UseTree::Glob(_) => true,
            syn::UseTree::Group(group) => group.items.iter().any(glob),
            syn::UseTree::Name(_) | syn::UseTree::Rename(_) => false,
        }
    }
    matches!(item, Item::Use(item) if !conditional(&Item::Use(item.clone())) && glob(&item.tree))
}

fn bind_names(item: &Item, bound: &mut std::collections::HashSet<String>) {
    struct Binder<'a>(&'a mut std::collections::HashSet<String>);
    impl Binder<'_> {
        fn tree(&mut self, tree: &syn::UseTree) {
            match tree {
                syn::UseTree::Path(path) => self.tree(&path.tree),
                syn::UseTree::Name(leaf) => {
                    self.0.insert(leaf.ident.to_string());
                }
                syn::UseTree::Rename(rename) => {
                    self.0.insert(rename.rename.to_string());
                }
                syn::UseTree::Glob(_) => {}
                syn::UseTree::Group(group) => group.items.iter().for_each(|tree| self.tree(tree)),
            }
        }
    }
    match item {
        Item::Use(item) => Binder(bound).tree(&item.tree),
        Item::Mod(item) => {
            bound.insert(item.ident.to_string());
        }
        Item::ExternCrate(item) => {
            let name = item
                .rename
                .as_ref()
                .map_or(&item.ident, |(_, rename)| rename);
            bound.insert(name.to_string());
        }
        _ => {}
    }
}

/// The kind of the item among `items` that declares or imports `name` among types and modules.
fn declared(items: &[&Item], name: &syn::Ident) -> Option<&'static str> {
    items.iter().find_map(|item| {
        let (attrs, taken, kind) = match item {
            Item::Mod(item) => (&item.attrs, item.ident == *name, "a module"),
            Item::Struct(item) => (&item.attrs, item.ident == *name, "a struct"),
            Item::Enum(item) => (&item.attrs, item.ident == *name, "an enum"),
            Item::Union(item) => (&item.attrs, item.ident == *name, "a union"),
            Item::Type(item) => (&item.attrs, item.ident == *name, "a type alias"),
            Item::Trait(item) => (&item.attrs, item.ident == *name, "a trait"),
            Item::TraitAlias(item) => (&item.attrs, item.ident == *name, "a trait alias"),
            Item::Use(item) => (&item.attrs, imports(&item.tree, name, None), "an import"),
            Item::ExternCrate(item) => {
                let bound = item
                    .rename
                    .as_ref()
                    .map_or(&item.ident, |(_, rename)| rename);
                (&item.attrs, bound == name, "an `extern crate`")
            }
            _ => return None,
        };
        let conditional = attrs
            .iter()
            .any(|attr| attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr"));
        (taken && !conditional).then_some(kind)
    })
}

/// Whether a `use` tree binds `name` (a glob binds nothing by name: an item declared here
/// shadows it).
fn imports(tree: &syn::UseTree, name: &syn::Ident, parent: Option<&syn::Ident>) -> bool {
    match tree {
        syn::UseTree::Path(path) => imports(&path.tree, name, Some(&path.ident)),
        syn::UseTree::Name(leaf) if leaf.ident == "self" => parent == Some(name),
        syn::UseTree::Name(leaf) => leaf.ident == *name,
        syn::UseTree::Rename(rename) => rename.rename == *name,
        syn::UseTree::Glob(_) => false,
        syn::UseTree::Group(group) => group.items.iter().any(|tree| imports(tree, name, parent)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The place of the first function called `name` in `source`, found by its position.
    fn place(source: &str, name: &str) -> Place {
        nth_place(source, name, 0)
    }

    /// The place of the `nth` function called `name`, found by its position.
    fn nth_place(source: &str, name: &str, nth: usize) -> Place {
        let summary = summarise(source).expect("parses");
        let found = summary
            .functions
            .iter()
            .filter(|found| found.name == name)
            .nth(nth)
            .expect("a function of that name");
        place_of(&summary, name, &found.signature, found.at)
    }

    /// The place of a function called `name` with `signature`, made by a macro whose name token is
    /// at `at`.
    fn place_by_macro(source: &str, name: &str, signature: &str, at: (usize, usize)) -> Place {
        let summary = summarise(source).expect("parses");
        place_of(&summary, name, signature, at)
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
    fn a_crate_reached_by_a_path_in_the_module_takes_it() {
        const CRATE: Place = Place::Free {
            taken_by: Some(super::CRATE_IN_A_PATH),
        };
        for (source, name) in [
            ("fn url(raw: &str) { let _ = url::Url::parse(raw); }", "url"),
            (
                "fn metrics(day: &str) { metrics::counter!(\"d\"); }",
                "metrics",
            ),
            (
                "#[derive(serde::Serialize)] struct A; fn serde(id: u64) {}",
                "serde",
            ),
            (
                "fn serde(id: u64) {} fn f() -> Option<serde::de::IgnoredAny> { None }",
                "serde",
            ),
            // A module of the parent's, brought by a glob import: the companion would hide it.
            // Before, a module of that name anywhere in the file passed it by.
            (
                "mod report { pub fn level() -> u8 { 3 } } \
                 mod jobs { use super::*; fn report(id: u64) -> u8 { report::level() } }",
                "report",
            ),
        ] {
            assert_eq!(place(source, name), CRATE, "{source}");
        }
        for (source, name) in [
            // The companion's own paths, a global path, one through another root, a crate reached
            // in a nested module only, and a field.
            (
                "fn send(id: u64) {} fn f() { send::outcome(c, 1); send::key(&1); send::job(); }",
                "send",
            ),
            (
                "fn url(raw: &str) { let _ = ::url::Url::parse(raw); }",
                "url",
            ),
            (
                "fn url(raw: &str) { let _ = crate::url::Url::parse(raw); }",
                "url",
            ),
            (
                "fn url(raw: &str) {} mod inner { fn f() { let _ = url::Url::parse(\"\"); } }",
                "url",
            ),
            ("fn url(raw: &str) { let _ = raw.url; }", "url"),
            // A name the file binds otherwise (a block's `use`, a module in a body), a macro's
            // `$name`, `quote!`'s `#name`, and code under `#[cfg]`.
            (
                "fn time(id: u64) {} fn f() { use std::time; time::Instant::now(); }",
                "time",
            ),
            (
                "fn report(id: u64) {} fn f() -> u8 { mod report { pub fn l() -> u8 { 3 } } report::l() }",
                "report",
            ),
            (
                "fn url(raw: &str) {} macro_rules! m { ($url:ident) => { $url::default() }; }",
                "url",
            ),
            (
                "fn url(raw: &str) {} fn f() { quote!(#url::new()); }",
                "url",
            ),
            (
                "fn url(raw: &str) {} #[cfg(feature = \"x\")] fn f() { url::Url::parse(\"\"); }",
                "url",
            ),
        ] {
            assert_eq!(
                place(source, name),
                Place::Free { taken_by: None },
                "{source}"
            );
        }
    }

    #[test]
    fn an_item_of_the_same_name_takes_it_in_its_own_scope_only() {
        assert_eq!(
            place("mod send {} fn send(id: u64) {}", "send"),
            Place::Free {
                taken_by: Some("a module")
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
    fn the_same_signature_in_two_kinds_of_place_is_told_apart_by_position() {
        let source = "fn send(id: u64) {}\nimpl A {\n    fn send(id: u64) {}\n}";
        assert_eq!(nth_place(source, "send", 0), Place::Free { taken_by: None });
        assert_eq!(nth_place(source, "send", 1), Place::Associated);
        // Made by a macro (found at no function's name): the two places disagree.
        assert_eq!(
            place_by_macro(source, "send", "fn send (id : u64)", (9, 9)),
            Place::Unknown
        );
        assert_eq!(
            place("fn send(id: u64) {} impl A { fn send(id: i64) {} }", "send"),
            Place::Free { taken_by: None }
        );
    }

    #[test]
    fn blocks_of_consts_and_statics_are_walked() {
        assert_eq!(
            place("const _: () = { impl A { fn send(id: u64) {} } };", "send"),
            Place::Associated
        );
        assert_eq!(
            place("static S: () = { fn send(id: u64) {} };", "send"),
            Place::Free { taken_by: None }
        );
        assert_eq!(
            place(
                "fn main() { if true { loop { impl A { fn send(id: u64) {} } } } }",
                "send"
            ),
            Place::Associated
        );
    }

    #[test]
    fn a_name_passed_to_a_macro_in_an_impl_block_is_associated() {
        let source = "impl A {\n    make!(send);\n}\nfn main() {\n    make!(other);\n}";
        assert_eq!(
            place_by_macro(source, "send", "fn send (id : u64)", (2, 10)),
            Place::Associated
        );
        assert_eq!(
            place_by_macro(source, "other", "fn other (id : u64)", (5, 10)),
            Place::Unknown
        );
    }

    #[test]
    fn an_import_of_the_same_name_takes_it() {
        for source in [
            "use a::send; fn send(id: u64) {}",
            "pub use a::{b, c::send}; fn send(id: u64) {}",
            "use a::other as send; fn send(id: u64) {}",
            "use a::send::{self}; fn send(id: u64) {}",
        ] {
            assert_eq!(
                place(source, "send"),
                Place::Free {
                    taken_by: Some("an import")
                },
                "{source}"
            );
        }
        for source in [
            "use a::*; fn send(id: u64) {}",
            "use a::send as other; fn send(id: u64) {}",
            "#[cfg(test)] use a::send; fn send(id: u64) {}",
            "use a::send::other; fn send(id: u64) {}",
        ] {
            assert_eq!(
                place(source, "send"),
                Place::Free { taken_by: None },
                "{source}"
            );
        }
        assert_eq!(
            place("extern crate a as send; fn send(id: u64) {}", "send"),
            Place::Free {
                taken_by: Some("an `extern crate`")
            }
        );
    }
}
