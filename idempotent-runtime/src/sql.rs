//! Statements written as SQL text by a database module, run as cached prepared statements.
//!
//! Each database module (`db::sqlite`, `db::postgres`, `db::mysql`) writes its statements as plain
//! SQL with `?` where a value is bound, each under a marker type of its own ([`sql!`]). A
//! [`Statement`] pairs that text with its bind values. Its query id is the marker type, so Diesel
//! prepares it once per connection and finds it again by type, with no SQL built per call (Diesel's
//! own `sql_query` is never cached, and its upserts have no static id). Every statement a job runs
//! goes through here, sync and async alike.

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::serialize::ToSql;
use diesel::sql_types::{HasSqlType, Untyped};

/// The text of one statement: SQL with a `?` for each bound value, in order.
pub trait SqlText: 'static {
    /// The statement.
    const SQL: &'static str;
}

/// The most `?`s a statement may hold (more is a compile error where the statement is run).
const MAX_MARKS: usize = 32;

/// Where a statement's `?`s are, found once, at compile time: the text between them is sliced on
/// every execution (Diesel walks a cached statement again to collect its binds) instead of
/// searched for.
pub struct Marks {
    /// The byte offset of each `?`, in order.
    at: [u16; MAX_MARKS],
    /// How many there are.
    count: usize,
}

impl Marks {
    /// The `?`s of `sql`.
    const fn of(sql: &str) -> Self {
        let bytes = sql.as_bytes();
        assert!(
            bytes.len() <= u16::MAX as usize,
            "a statement longer than 65,535 bytes"
        );
        let mut at = [0u16; MAX_MARKS];
        let mut count = 0;
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'?' {
                assert!(count < MAX_MARKS, "a statement with more than 32 `?`s");
                at[count] = i as u16;
                count += 1;
            }
            i += 1;
        }
        Self { at, count }
    }
}

/// [`Marks`] of every statement.
trait Marked {
    /// Where the `?`s are.
    const MARKS: Marks;
}

impl<S: SqlText> Marked for S {
    const MARKS: Marks = Marks::of(S::SQL);
}

/// The pieces of a statement's text around its `?`s, in order: the text before the first, then
/// the text after each.
pub struct Pieces {
    sql: &'static str,
    marks: &'static Marks,
    /// The next piece: 0 is the text before the first `?`, `n` the text after the `n`th.
    next: usize,
}

impl Pieces {
    /// The pieces of statement `S`.
    fn of<S: SqlText>() -> Self {
        Self {
            sql: S::SQL,
            marks: &<S as Marked>::MARKS,
            next: 0,
        }
    }

    /// The next piece ("" past the last).
    fn next_piece(&mut self) -> &'static str {
        let n = self.next;
        self.next += 1;
        let count = self.marks.count;
        if n > count {
            return "";
        }
        let start = if n == 0 {
            0
        } else {
            self.marks.at[n - 1] as usize + 1
        };
        let end = if n == count {
            self.sql.len()
        } else {
            self.marks.at[n] as usize
        };
        // Each bound is a `?` (ASCII, so a char boundary) or an end of the text.
        self.sql.get(start..end).unwrap_or("")
    }
}

/// Declares statements: `sql! { Name = "SELECT ... WHERE a = ?"; ... }`.
macro_rules! sql {
    ($($(#[$attr:meta])* $name:ident = $text:expr;)*) => {
        $(
            $(#[$attr])*
            pub(crate) struct $name;

            $(#[$attr])*
            impl $crate::sql::SqlText for $name {
                const SQL: &'static str = $text;
            }
        )*
    };
}

/// A value bound to a `?`, with its SQL type `ST`.
pub struct Bind<ST, T> {
    value: T,
    sql_type: PhantomData<fn() -> ST>,
}

/// Binds `value` as SQL type `ST`.
pub fn bind<ST, T>(value: T) -> Bind<ST, T> {
    Bind {
        value,
        sql_type: PhantomData,
    }
}

/// How many `?`s one bind value fills.
pub trait SlotCount {
    /// The number of `?`s.
    const COUNT: usize;
}

/// One bind value of a statement, pushed at its `?`s, each followed by the SQL text after it.
pub trait Slot<DB: Backend>: SlotCount {
    /// Pushes the value (at each of its `?`s) and the text that follows.
    fn push<'b>(&'b self, text: &mut Pieces, pass: &mut AstPass<'_, 'b, DB>) -> QueryResult<()>;
}

impl<ST, T> SlotCount for Bind<ST, T> {
    const COUNT: usize = 1;
}

impl<DB: Backend + HasSqlType<ST>, ST, T: ToSql<ST, DB>> Slot<DB> for Bind<ST, T> {
    fn push<'b>(&'b self, text: &mut Pieces, pass: &mut AstPass<'_, 'b, DB>) -> QueryResult<()> {
        pass.push_bind_param::<ST, T>(&self.value)?;
        pass.push_sql(text.next_piece());
        Ok(())
    }
}

#[cfg(feature = "sqlite")]
/// A value bound to two `?`s in a row (SQLite's `now_plus!`, which tests the value for NULL before
/// it uses it).
pub struct Twice<ST, T>(Bind<ST, T>);

/// Binds `value` as SQL type `ST` to the next two `?`s.
#[cfg(feature = "sqlite")]
pub fn twice<ST, T>(value: T) -> Twice<ST, T> {
    Twice(bind(value))
}

#[cfg(feature = "sqlite")]
impl<ST, T> SlotCount for Twice<ST, T> {
    const COUNT: usize = 2;
}

#[cfg(feature = "sqlite")]
impl<DB: Backend + HasSqlType<ST>, ST, T: ToSql<ST, DB>> Slot<DB> for Twice<ST, T> {
    fn push<'b>(&'b self, text: &mut Pieces, pass: &mut AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.push(text, pass)?;
        self.0.push(text, pass)
    }
}

/// Up to `N` ids bound to `N` `?`s in a row (an `IN (?, ..., ?)` list), the places after the
/// last id bound to NULL, which no id equals.
#[cfg(any(feature = "mysql", feature = "async-mysql"))]
pub struct IdList<const N: usize>([Option<i64>; N]);

#[cfg(any(feature = "mysql", feature = "async-mysql"))]
impl<const N: usize> IdList<N> {
    /// The ids of `ids`, which holds at most `N`.
    pub fn new(ids: impl IntoIterator<Item = i64>) -> Self {
        let mut list = [None; N];
        for (place, id) in list.iter_mut().zip(ids) {
            *place = Some(id);
        }
        Self(list)
    }
}

#[cfg(any(feature = "mysql", feature = "async-mysql"))]
impl<const N: usize> SlotCount for IdList<N> {
    const COUNT: usize = N;
}

#[cfg(any(feature = "mysql", feature = "async-mysql"))]
impl<DB, const N: usize> Slot<DB> for IdList<N>
where
    DB: Backend + HasSqlType<diesel::sql_types::Nullable<diesel::sql_types::BigInt>>,
    Option<i64>: ToSql<diesel::sql_types::Nullable<diesel::sql_types::BigInt>, DB>,
{
    fn push<'b>(&'b self, text: &mut Pieces, pass: &mut AstPass<'_, 'b, DB>) -> QueryResult<()> {
        for id in &self.0 {
            pass.push_bind_param::<diesel::sql_types::Nullable<diesel::sql_types::BigInt>, _>(id)?;
            pass.push_sql(text.next_piece());
        }
        Ok(())
    }
}

/// How many values a bind tuple holds.
pub trait BindCount {
    /// The number of `?`s the values fill.
    const COUNT: usize;
}

/// The bind values of a statement, in the order of its `?`s.
pub trait Binds<DB: Backend>: BindCount {
    /// Pushes each value, each followed by the SQL text after its `?`.
    fn push<'b>(&'b self, text: &mut Pieces, pass: &mut AstPass<'_, 'b, DB>) -> QueryResult<()>;
}

macro_rules! impl_binds {
    ($($name:ident $slot:ident),*) => {
        impl<$($slot: SlotCount),*> BindCount for ($($slot,)*) {
            const COUNT: usize = 0 $(+ $slot::COUNT)*;
        }

        impl<DB: Backend, $($slot: Slot<DB>),*> Binds<DB> for ($($slot,)*) {
            #[allow(unused_variables, non_snake_case)]
            fn push<'b>(
                &'b self,
                text: &mut Pieces,
                pass: &mut AstPass<'_, 'b, DB>,
            ) -> QueryResult<()> {
                let ($($name,)*) = self;
                $($name.push(text, pass)?;)*
                Ok(())
            }
        }
    };
}

impl_binds!();
impl_binds!(a A);
impl_binds!(a A, b B);
impl_binds!(a A, b B, c C);
impl_binds!(a A, b B, c C, d D);
impl_binds!(a A, b B, c C, d D, e E);
impl_binds!(a A, b B, c C, d D, e E, f F);
impl_binds!(a A, b B, c C, d D, e E, f F, g G);
impl_binds!(a A, b B, c C, d D, e E, f F, g G, h H);
impl_binds!(a A, b B, c C, d D, e E, f F, g G, h H, i I);
impl_binds!(a A, b B, c C, d D, e E, f F, g G, h H, i I, j J);
impl_binds!(a A, b B, c C, d D, e E, f F, g G, h H, i I, j J, k K);

/// A statement `S` with its bind values `B`; see the [module docs](self).
pub struct Statement<S, B> {
    binds: B,
    text: PhantomData<fn() -> S>,
}

impl<S: SqlText, B: BindCount> Statement<S, B> {
    /// The statement `S` with `binds` for its `?`s (a compile error when their numbers differ).
    pub fn new(binds: B) -> Self {
        const {
            assert!(
                <S as Marked>::MARKS.count == B::COUNT,
                "a statement's bind values do not match its `?`s"
            );
        }
        Self {
            binds,
            text: PhantomData,
        }
    }
}

impl<S: SqlText, B> QueryId for Statement<S, B> {
    type QueryId = S;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<DB: Backend, S: SqlText, B: Binds<DB>> QueryFragment<DB> for Statement<S, B> {
    fn walk_ast<'b>(&'b self, mut pass: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        let mut text = Pieces::of::<S>();
        pass.push_sql(text.next_piece());
        self.binds.push(&mut text, &mut pass)
    }
}

/// Rows come back by column name ([`diesel::QueryableByName`]).
impl<S, B> Query for Statement<S, B> {
    type SqlType = Untyped;
}

impl<S, B, Conn> diesel::RunQueryDsl<Conn> for Statement<S, B> {}
