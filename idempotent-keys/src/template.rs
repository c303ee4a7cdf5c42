//! The key template language, parsed as a pure function over a `&str`.
//!
//! ```text
//! invoice:<month>:<customer_id>      text and placeholders
//! charge:<order.id>:<order.lines.0>  a placeholder reaches into fields (and tuple fields)
//! kind:<r#type> or kind:<type>       raw identifiers; both name the parameter `r#type`
//! tag:\<b\>:<id>                     `\<`, `\>` and `\\` are a literal `<`, `>` and `\`
//! ```
//!
//! Between two placeholders there must be text starting with a symbol (not a letter, digit or `%`);
//! the runtime escapes that symbol inside values, which keeps keys unambiguous (see [`crate::escape`]).

use std::fmt::Write as _;
use std::ops::Range;

use crate::Part;
use crate::escape::{ShapeProblem, shape_problems};

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Text and placeholders, in order; no two texts touch.
    pub pieces: Vec<Piece>,
}

/// A piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Literal text, unescaped.
    Text(String),
    /// A placeholder.
    Placeholder(Placeholder),
}

/// A `<...>` placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    /// The parameter, then any fields.
    pub path: Vec<Segment>,
    /// Byte range of `<...>` in the template source.
    pub range: Range<usize>,
}

/// One step of a placeholder's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// A name, without any `r#`.
    Name(String),
    /// A tuple field.
    Index(u32),
}

/// One problem in a template, with the part of the source it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    /// What is wrong and how to fix it.
    pub message: String,
    /// Byte range in the template source.
    pub range: Range<usize>,
}

impl Placeholder {
    /// The placeholder as it would be written, `<a.b>`.
    pub fn display(&self) -> String {
        let mut out = String::from("<");
        for (i, segment) in self.path.iter().enumerate() {
            if i > 0 {
                out.push('.');
            }
            match segment {
                Segment::Name(name) if is_keyword(name) => {
                    let _ = write!(out, "r#{name}");
                }
                Segment::Name(name) => out.push_str(name),
                Segment::Index(index) => {
                    let _ = write!(out, "{index}");
                }
            }
        }
        out.push('>');
        out
    }
}

impl Template {
    /// The placeholders, in order.
    pub fn placeholders(&self) -> impl Iterator<Item = &Placeholder> {
        self.pieces.iter().filter_map(|piece| match piece {
            Piece::Placeholder(p) => Some(p),
            Piece::Text(_) => None,
        })
    }

    /// The characters the runtime must escape inside values: the first character of every text that
    /// stands between two placeholders (see [`crate::escape::escapes`]).
    pub fn escapes(&self) -> Vec<char> {
        crate::escape::escapes(&self.parts())
    }

    /// The template as the runtime and the registry see it; a placeholder is named by its path as
    /// written (`job.customer_id`).
    pub fn parts(&self) -> Vec<Part<'_>> {
        self.pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => Part::Text(text),
                Piece::Placeholder(_) => Part::Value(""),
            })
            .collect()
    }

    /// The template written back in the template language (a parse of it gives `self` again).
    pub fn to_source(&self) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => {
                    for c in text.chars() {
                        if matches!(c, '<' | '>' | '\\') {
                            out.push('\\');
                        }
                        out.push(c);
                    }
                }
                Piece::Placeholder(p) => out.push_str(&p.display()),
            }
        }
        out
    }
}

/// Parses `source`, reporting every problem at once: the template holds every piece that parsed,
/// so that its placeholders can be checked too in the same build.
pub fn parse(source: &str) -> (Template, Vec<TemplateError>) {
    let mut parser = Parser {
        source,
        chars: source.char_indices().peekable(),
        pieces: Vec::new(),
        text: String::new(),
        errors: Vec::new(),
    };
    while let Some((at, c)) = parser.chars.next() {
        match c {
            '\\' => parser.escape(at),
            '>' => parser.error(
                "unexpected `>` with no `<` before it; write `\\>` for a literal `>`".to_owned(),
                at..at + 1,
            ),
            '<' => parser.placeholder(at),
            c if c.is_control() => parser.error(
                format!(
                    "the template contains the control character {c:?}; keys are readable text"
                ),
                at..at + c.len_utf8(),
            ),
            c => parser.text.push(c),
        }
    }
    let Parser {
        mut pieces,
        text,
        mut errors,
        ..
    } = parser;
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    check_separators(source, &pieces, &mut errors);
    (Template { pieces }, errors)
}

/// The state of [`parse`]: what is left of the source, and what it made so far.
struct Parser<'s> {
    source: &'s str,
    chars: std::iter::Peekable<std::str::CharIndices<'s>>,
    pieces: Vec<Piece>,
    /// Literal text since the last placeholder.
    text: String,
    errors: Vec<TemplateError>,
}

impl Parser<'_> {
    fn error(&mut self, message: String, range: std::ops::Range<usize>) {
        self.errors.push(TemplateError { message, range });
    }

    /// After a `\\` at `at`: an escaped `<`, `>` or `\\`.
    fn escape(&mut self, at: usize) {
        match self.chars.next() {
            Some((_, escaped @ ('<' | '>' | '\\'))) => self.text.push(escaped),
            Some((next_at, other)) => self.error(
                format!(
                    "unknown escape `\\{other}`; only `\\<`, `\\>` and `\\\\` are escapes (a literal `<`, `>` and `\\`)"
                ),
                at..next_at + other.len_utf8(),
            ),
            None => self.error(
                "the template ends with a lone `\\`; write `\\\\` for a literal backslash".to_owned(),
                at..self.source.len(),
            ),
        }
    }

    /// After a `<` at `at`: a placeholder up to its `>`, or an error saying what is wrong with it.
    fn placeholder(&mut self, at: usize) {
        let (end, nested) = match self.closing(at) {
            Ok(closed) => closed,
            Err(stop) => {
                let written = &self.source[at..stop];
                return self.error(
                    format!(
                        "unclosed placeholder `{written}`: add the closing `>`, or write `\\<` for a literal `<`"
                    ),
                    at..stop,
                );
            }
        };
        let written = &self.source[at..end];
        if nested {
            return self.error(
                format!(
                    "placeholders cannot nest: `{written}`; a placeholder is one parameter name like `<customer_id>`, or a field path like `<job.customer_id>`"
                ),
                at..end,
            );
        }
        match parse_path(&self.source[at + 1..end - 1]) {
            Ok(path) => {
                if !self.text.is_empty() {
                    self.pieces
                        .push(Piece::Text(std::mem::take(&mut self.text)));
                }
                self.pieces.push(Piece::Placeholder(Placeholder {
                    path,
                    range: at..end,
                }));
            }
            Err(message) => self.error(message, at..end),
        }
    }

    /// Scans to the `>` closing the placeholder opened at `at`: its end and whether it nested.
    /// A `<` right after the opening one is a nested placeholder (`<<a>>`), consumed whole; a `<`
    /// after some name means this one was never closed (`<month:<id>`): `Err` with where it stops,
    /// and parsing restarts at the new `<`.
    fn closing(&mut self, at: usize) -> Result<(usize, bool), usize> {
        let mut depth = 1usize;
        let mut nested = false;
        while let Some(&(inner_at, inner)) = self.chars.peek() {
            match inner {
                '<' if !nested && inner_at > at + 1 => return Err(inner_at),
                '<' => {
                    depth += 1;
                    nested = true;
                }
                '>' => {
                    depth -= 1;
                    if depth == 0 {
                        self.chars.next();
                        return Ok((inner_at + 1, nested));
                    }
                }
                _ => {}
            }
            self.chars.next();
        }
        Err(self.source.len())
    }
}

/// Two placeholders need text between them that starts with a symbol: the runtime escapes that
/// symbol inside values, so keys can be split back into values unambiguously.
fn check_separators(source: &str, pieces: &[Piece], errors: &mut Vec<TemplateError>) {
    let template = Template {
        pieces: pieces.to_vec(),
    };
    let placeholder = |index: usize| match &pieces[index] {
        Piece::Placeholder(p) => Some(p),
        Piece::Text(_) => None,
    };
    for problem in shape_problems(&template.parts()) {
        let (ShapeProblem::Touching { before, after }
        | ShapeProblem::BadSeparator { before, after, .. }) = problem;
        let (Some(before), Some(next)) = (placeholder(before), placeholder(after)) else {
            continue;
        };
        let range = before.range.start..next.range.end;
        let shown = &source[range.clone()];
        let message = match problem {
            ShapeProblem::Touching { .. } => format!(
                "placeholders `{}` and `{}` touch in `{shown}`; put a separator such as `:` between them, or two different values could give the same key",
                before.display(),
                next.display()
            ),
            ShapeProblem::BadSeparator { starts_with, .. } => format!(
                "the text between `{}` and `{}` in `{shown}` starts with `{starts_with}`; start it with a symbol such as `:`, `/` or `-` (not a letter, digit or `%`), or two different values could give the same key",
                before.display(),
                next.display()
            ),
        };
        errors.push(TemplateError { message, range });
    }
}

fn parse_path(inner: &str) -> Result<Vec<Segment>, String> {
    if inner.is_empty() {
        return Err(
            "empty placeholder `<>`: name a parameter of the function, like `<customer_id>`"
                .to_owned(),
        );
    }
    if inner.chars().any(char::is_whitespace) {
        let trimmed: String = inner.chars().filter(|c| !c.is_whitespace()).collect();
        return Err(format!(
            "spaces are not allowed inside a placeholder: write `<{trimmed}>` instead of `<{inner}>`"
        ));
    }
    let mut path = Vec::new();
    for (i, part) in inner.split('.').enumerate() {
        if i > 0
            && !part.is_empty()
            && part.bytes().all(|b| b.is_ascii_digit())
            && let Ok(index) = part.parse::<u32>()
            && (part == "0" || !part.starts_with('0'))
        {
            path.push(Segment::Index(index));
            continue;
        }
        match parse_ident(part) {
            // `self` names a method's receiver, first; no field is named `self`, `Self`, `super`
            // or `crate`, nor can one be written raw.
            Some(name)
                if matches!(name.as_str(), "self" | "Self" | "super" | "crate")
                    && !(i == 0 && name == "self") =>
            {
                return Err(format!(
                    "`{name}` in `<{inner}>` is not a parameter or field name: `{name}` is a keyword that no parameter or field can be named"
                ));
            }
            Some(name) => path.push(Segment::Name(name)),
            None => return Err(not_an_identifier(inner, part)),
        }
    }
    Ok(path)
}

fn not_an_identifier(inner: &str, part: &str) -> String {
    let mut message = if part.is_empty() {
        format!("`<{inner}>` has an empty name; a field path looks like `<job.customer_id>`")
    } else if part.starts_with(|c: char| c.is_ascii_digit()) {
        format!("`{part}` in `<{inner}>` is not a parameter name: names start with a letter or `_`")
    } else {
        format!(
            "`{part}` in `<{inner}>` is not a parameter name: use letters, digits and `_`, and `.` for a field"
        )
    };
    // What a Rust expression would be there: said what it is, not mended into a name that is no
    // parameter either (`<Self::KIND>` was "did you mean `<Self__KIND>`?").
    let expression = if part.contains("::") {
        Some(
            "; a path (a constant, an associated item) is no placeholder: write its value into the template as fixed text, or take it as a parameter",
        )
    } else if part.contains(['(', ')']) {
        Some(
            "; a call is no placeholder: placeholders name parameters and their fields; compute the value where the job is called and take it as a parameter",
        )
    } else if part.contains(['[', ']']) {
        Some(
            "; an index is no placeholder: a tuple's field is `<pair.0>`; take an element of a list as a parameter of its own",
        )
    } else {
        None
    };
    if let Some(hint) = expression {
        message.push_str(hint);
        return message;
    }
    let fixed: String = part
        .chars()
        .map(|c| {
            if unicode_ident::is_xid_continue(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if fixed != part && parse_ident(&fixed).is_some() {
        let _ = write!(
            message,
            "; did you mean `<{}>`?",
            inner.replace(part, &fixed)
        );
    }
    message
}

/// An identifier, raw or not, returned without `r#`.
fn parse_ident(part: &str) -> Option<String> {
    let (raw, name) = match part.strip_prefix("r#") {
        Some(name) => (true, name),
        None => (false, part),
    };
    // Rust's identifiers: XID_Start or `_`, then XID_Continue (which holds the combining marks
    // of many scripts, a virama, U+00B7, that are not alphanumeric).
    let mut chars = name.chars();
    let first = chars.next()?;
    if !(first == '_' || unicode_ident::is_xid_start(first))
        || !chars.all(unicode_ident::is_xid_continue)
    {
        return None;
    }
    if name == "_" || (raw && matches!(name, "self" | "Self" | "super" | "crate")) {
        return None;
    }
    Some(name.to_owned())
}

/// Rust keywords, which a parameter can only be named with `r#`.
pub fn is_keyword(name: &str) -> bool {
    matches!(
        name,
        "as" | "break"
            | "const"
            | "continue"
            | "crate"
            | "else"
            | "enum"
            | "extern"
            | "false"
            | "fn"
            | "for"
            | "if"
            | "impl"
            | "in"
            | "let"
            | "loop"
            | "match"
            | "mod"
            | "move"
            | "mut"
            | "pub"
            | "ref"
            | "return"
            | "static"
            | "struct"
            | "super"
            | "trait"
            | "true"
            | "type"
            | "unsafe"
            | "use"
            | "where"
            | "while"
            | "async"
            | "await"
            | "dyn"
            | "abstract"
            | "become"
            | "box"
            | "do"
            | "final"
            | "macro"
            | "override"
            | "priv"
            | "typeof"
            | "unsized"
            | "virtual"
            | "yield"
            | "try"
            | "gen"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(t: &Template) -> Vec<String> {
        t.placeholders().map(Placeholder::display).collect()
    }

    fn errors(source: &str) -> Vec<String> {
        let (_, errors) = parse(source);
        assert!(!errors.is_empty(), "{source:?} should be rejected");
        errors.into_iter().map(|e| e.message).collect()
    }

    fn ok(source: &str) -> Template {
        let (template, errors) = parse(source);
        assert!(errors.is_empty(), "{source:?}: {errors:?}");
        template
    }

    #[test]
    fn text_and_placeholders() {
        let t = ok("invoice:<month>:<customer_id>");
        assert_eq!(names(&t), ["<month>", "<customer_id>"]);
        assert_eq!(t.pieces[0], Piece::Text("invoice:".into()));
        assert_eq!(t.escapes(), [':']);
    }

    #[test]
    fn field_paths_raw_identifiers_and_tuple_fields() {
        let t = ok("<job.customer.id>/<r#type>/<type>/<pair.0>");
        let paths: Vec<_> = t.placeholders().map(|p| p.path.clone()).collect();
        assert_eq!(
            paths[0],
            ["job", "customer", "id"].map(|s| Segment::Name(s.into()))
        );
        assert_eq!(paths[1], [Segment::Name("type".into())]);
        assert_eq!(paths[2], [Segment::Name("type".into())]);
        assert_eq!(paths[3], [Segment::Name("pair".into()), Segment::Index(0)]);
    }

    /// Every name Rust allows for a parameter or a field: XID_Start or `_`, then XID_Continue.
    /// A Devanagari virama (U+094D) and a middle dot (U+00B7) are XID_Continue but not
    /// alphanumeric: `<क्रम>` was "not a parameter name; did you mean `<क_रम>`?".
    #[test]
    fn every_identifier_rust_allows_is_a_name() {
        let t = ok("a:<क्रम>:<col·lecció>:<numéro>:<job.ǅ_x>");
        assert_eq!(
            names(&t),
            ["<क्रम>", "<col·lecció>", "<numéro>", "<job.ǅ_x>"]
        );
        assert!(errors("a:<x-y>")[0].contains("did you mean `<x_y>`?"));
        assert!(errors("a:<·x>")[0].contains("is not a parameter name"));
    }

    /// `<self.id>` names a method's receiver; `super`, `crate`, `Self`, and `self` after the
    /// first segment name nothing: a clear message (the attribute panicked on `<job.super>`,
    /// making a raw identifier of it).
    #[test]
    fn keywords_that_no_name_can_be_are_refused() {
        ok("a:<self.id>");
        for source in [
            "a:<job.super>",
            "a:<job.crate>",
            "a:<job.Self>",
            "a:<job.self>",
            "a:<super>",
            "a:<r#crate>",
        ] {
            let message = &errors(source)[0];
            assert!(
                message.contains("is not a parameter or field name")
                    || message.contains("is not a parameter name"),
                "{source}: {message}"
            );
        }
    }

    #[test]
    fn escapes_give_literal_angle_brackets() {
        let t = ok(r"tag:\<b\>\\:<id>");
        assert_eq!(t.pieces[0], Piece::Text(r"tag:<b>\:".into()));
        assert_eq!(t.to_source(), r"tag:\<b\>\\:<id>");
    }

    #[test]
    fn each_misuse_has_its_message() {
        assert!(errors("a:<id")[0].starts_with("unclosed placeholder `<id`"));
        assert!(errors("a>b:<id>")[0].starts_with("unexpected `>`"));
        assert!(errors("<<a>>")[0].starts_with("placeholders cannot nest: `<<a>>`"));
        assert!(errors("a:<>")[0].starts_with("empty placeholder"));
        assert!(errors("<customer-id>")[0].contains("did you mean `<customer_id>`?"));
        // Expressions are said to be so, not mended into other names that are no parameters
        // (`<Self__KIND>`, `<id.len__>`, `<ids_0_>` before).
        for (template, says) in [
            (
                "<Self::KIND>",
                "a path (a constant, an associated item) is no placeholder",
            ),
            ("<id.len()>", "a call is no placeholder"),
            ("<ids[0]>", "an index is no placeholder"),
        ] {
            let error = &errors(template)[0];
            assert!(
                error.contains(says) && !error.contains("did you mean"),
                "{template}: {error}"
            );
        }
        assert!(errors("<1x>")[0].contains("names start with a letter"));
        assert!(errors("< id >")[0].contains("write `<id>`"));
        assert!(errors("<a><b>")[0].contains("touch"));
        assert!(errors("<a>x<b>")[0].contains("starts with `x`"));
        assert!(errors("<a>%<b>")[0].contains("starts with `%`"));
        assert!(errors(r"\q<a>")[0].starts_with("unknown escape"));
        assert!(errors("a\n<b>")[0].contains("control character"));
    }

    #[test]
    fn all_errors_are_reported_at_once() {
        assert_eq!(errors("<a-b>:<>:<c").len(), 3);
        let (template, errors) = parse("invoice:<month:<custmer_id>:<>:<1st>");
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0]
                .message
                .starts_with("unclosed placeholder `<month:`")
        );
        assert_eq!(
            names(&template),
            ["<custmer_id>"],
            "still checked against the parameters"
        );
    }

    fn template_source() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                "[a-z:/\\-_.]{1,4}",
                "<[a-z_][a-z0-9_]{0,5}(\\.[a-z_][a-z0-9_]{0,3}){0,2}>",
                "\\\\[<>\\\\]",
            ],
            0..6,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest! {
        #[test]
        fn no_input_makes_the_parser_panic(source in "\\PC*") {
            let _ = parse(&source);
        }

        #[test]
        fn no_ascii_input_makes_the_parser_panic(source in "[ -~\\n]{0,40}") {
            let _ = parse(&source);
        }

        #[test]
        fn every_accepted_template_round_trips(source in template_source()) {
            let (template, errors) = parse(&source);
            if errors.is_empty() {
                let (again, errors_again) = parse(&template.to_source());
                prop_assert!(errors_again.is_empty(), "a written-back template parses");
                prop_assert_eq!(&again.pieces.len(), &template.pieces.len());
                prop_assert_eq!(again.to_source(), template.to_source());
                let placeholders: Vec<_> = template.placeholders().map(|p| &p.path).collect();
                let placeholders_again: Vec<_> = again.placeholders().map(|p| &p.path).collect();
                prop_assert_eq!(placeholders, placeholders_again);
            }
        }
    }
}
