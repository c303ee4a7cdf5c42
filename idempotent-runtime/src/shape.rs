//! A value as serde sees it, to tell whether a stored result reads back as the same value.
//!
//! JSON loses some of what serde says about a value: `Some(())`, `Some(None)` and `None` are all
//! `null`, and the variant of an `#[serde(untagged)]` enum is not written at all. A result whose
//! JSON reads back as another value would replay another answer than the first run gave. The
//! runtime compares the [`Shape`] of the value a job returned with the shape of the value its JSON
//! reads back as (maps compared whatever their order, floats bit for bit), and refuses the result
//! when they differ.

use std::fmt;

use serde::Serialize;

/// What serde says of a value: each scalar with its kind, each `Some` and `None`, each variant's
/// index, each compound's parts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Shape {
    Bool(bool),
    Signed(i128),
    Unsigned(u128),
    F32(u32),
    F64(u64),
    Char(char),
    Str(String),
    Bytes(Vec<u8>),
    Unit,
    None,
    Some(Box<Shape>),
    Variant(u32, Box<Shape>),
    /// A sequence's elements, sorted: a `HashSet` is one, and reads back in another order. A tuple's
    /// in their order.
    Seq(Vec<Shape>),
    /// Entries sorted: a `HashMap` reads back in another order.
    Map(Vec<(Shape, Shape)>),
}

impl Shape {
    /// The shape of `value`, or why serde could not give it.
    pub(crate) fn of<T: Serialize + ?Sized>(value: &T) -> Result<Shape, NoShape> {
        value.serialize(Shaper)
    }
}

/// Why a value has no [`Shape`] (its `Serialize` failed), or why another serializer of the
/// runtime's refused it.
#[derive(Debug)]
pub(crate) struct NoShape(pub(crate) String);

impl fmt::Display for NoShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoShape {}

impl serde::ser::Error for NoShape {
    fn custom<T: fmt::Display>(message: T) -> Self {
        NoShape(message.to_string())
    }
}

/// The serializer that builds a [`Shape`].
struct Shaper;

/// A compound value's parts as they come: `variant` for an enum's; `map` for entries, `sequence`
/// for elements in no order that matters.
struct Parts {
    variant: Option<u32>,
    map: bool,
    sequence: bool,
    parts: Vec<Shape>,
    entries: Vec<(Shape, Shape)>,
    key: Option<Shape>,
}

impl Parts {
    fn new(variant: Option<u32>, map: bool) -> Self {
        Parts {
            variant,
            map,
            sequence: false,
            parts: Vec::new(),
            entries: Vec::new(),
            key: None,
        }
    }

    fn done(self) -> Shape {
        let shape = if self.map {
            let mut entries = self.entries;
            entries.sort();
            Shape::Map(entries)
        } else {
            let mut parts = self.parts;
            if self.sequence {
                parts.sort();
            }
            Shape::Seq(parts)
        };
        match self.variant {
            Some(index) => Shape::Variant(index, Box::new(shape)),
            None => shape,
        }
    }
}

/// A scalar's shape.
macro_rules! scalars {
    ($($method:ident($arg:ty) => $shape:expr;)*) => {
        $(fn $method(self, value: $arg) -> Result<Shape, NoShape> {
            #[allow(clippy::redundant_closure_call)]
            Ok(($shape)(value))
        })*
    };
}

impl serde::Serializer for Shaper {
    type Ok = Shape;
    type Error = NoShape;
    type SerializeSeq = Parts;
    type SerializeTuple = Parts;
    type SerializeTupleStruct = Parts;
    type SerializeTupleVariant = Parts;
    type SerializeMap = Parts;
    type SerializeStruct = Parts;
    type SerializeStructVariant = Parts;

    scalars! {
        serialize_bool(bool) => Shape::Bool;
        serialize_i8(i8) => |v| Shape::Signed(i128::from(v));
        serialize_i16(i16) => |v| Shape::Signed(i128::from(v));
        serialize_i32(i32) => |v| Shape::Signed(i128::from(v));
        serialize_i64(i64) => |v| Shape::Signed(i128::from(v));
        serialize_i128(i128) => Shape::Signed;
        serialize_u8(u8) => |v| Shape::Unsigned(u128::from(v));
        serialize_u16(u16) => |v| Shape::Unsigned(u128::from(v));
        serialize_u32(u32) => |v| Shape::Unsigned(u128::from(v));
        serialize_u64(u64) => |v| Shape::Unsigned(u128::from(v));
        serialize_u128(u128) => Shape::Unsigned;
        serialize_f32(f32) => |v: f32| Shape::F32(v.to_bits());
        serialize_f64(f64) => |v: f64| Shape::F64(v.to_bits());
        serialize_char(char) => Shape::Char;
        serialize_str(&str) => |v: &str| Shape::Str(v.to_owned());
        serialize_bytes(&[u8]) => |v: &[u8]| Shape::Bytes(v.to_vec());
    }

    fn serialize_none(self) -> Result<Shape, NoShape> {
        Ok(Shape::None)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Shape, NoShape> {
        Ok(Shape::Some(Box::new(value.serialize(Shaper)?)))
    }

    fn serialize_unit(self) -> Result<Shape, NoShape> {
        Ok(Shape::Unit)
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<Shape, NoShape> {
        Ok(Shape::Unit)
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
    ) -> Result<Shape, NoShape> {
        Ok(Shape::Variant(index, Box::new(Shape::Unit)))
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Shape, NoShape> {
        value.serialize(Shaper)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
        value: &T,
    ) -> Result<Shape, NoShape> {
        Ok(Shape::Variant(index, Box::new(value.serialize(Shaper)?)))
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Parts, NoShape> {
        Ok(Parts {
            sequence: true,
            ..Parts::new(None, false)
        })
    }

    fn serialize_tuple(self, _: usize) -> Result<Parts, NoShape> {
        Ok(Parts::new(None, false))
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Parts, NoShape> {
        Ok(Parts::new(None, false))
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Parts, NoShape> {
        Ok(Parts::new(Some(index), false))
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Parts, NoShape> {
        Ok(Parts::new(None, true))
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Parts, NoShape> {
        Ok(Parts::new(None, true))
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Parts, NoShape> {
        Ok(Parts::new(Some(index), true))
    }
}

/// An element of a sequence, a tuple or a variant's tuple.
macro_rules! elements {
    ($($trait:ident::$method:ident;)*) => {
        $(impl serde::ser::$trait for Parts {
            type Ok = Shape;
            type Error = NoShape;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NoShape> {
                self.parts.push(value.serialize(Shaper)?);
                Ok(())
            }
            fn end(self) -> Result<Shape, NoShape> {
                Ok(self.done())
            }
        })*
    };
}

elements! {
    SerializeSeq::serialize_element;
    SerializeTuple::serialize_element;
    SerializeTupleStruct::serialize_field;
    SerializeTupleVariant::serialize_field;
}

/// A field of a struct or a variant's struct: an entry under its name.
macro_rules! fields {
    ($($trait:ident;)*) => {
        $(impl serde::ser::$trait for Parts {
            type Ok = Shape;
            type Error = NoShape;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), NoShape> {
                self.entries
                    .push((Shape::Str(key.to_owned()), value.serialize(Shaper)?));
                Ok(())
            }
            fn end(self) -> Result<Shape, NoShape> {
                Ok(self.done())
            }
        })*
    };
}

fields! {
    SerializeStruct;
    SerializeStructVariant;
}

impl serde::ser::SerializeMap for Parts {
    type Ok = Shape;
    type Error = NoShape;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), NoShape> {
        self.key = Some(key.serialize(Shaper)?);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NoShape> {
        let key = self
            .key
            .take()
            .ok_or_else(|| NoShape("a map's value came before its key".to_owned()))?;
        self.entries.push((key, value.serialize(Shaper)?));
        Ok(())
    }

    fn end(self) -> Result<Shape, NoShape> {
        Ok(self.done())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    #[test]
    fn what_json_loses_the_shape_keeps() {
        assert_ne!(
            Shape::of(&Some(())).unwrap(),
            Shape::of(&None::<()>).unwrap()
        );
        assert_ne!(
            Shape::of(&Some(None::<u8>)).unwrap(),
            Shape::of(&None::<Option<u8>>).unwrap()
        );
        assert_ne!(Shape::of(&0.0_f64).unwrap(), Shape::of(&-0.0_f64).unwrap());
        let forward: HashMap<u32, u32> = (0..64).map(|i| (i, i * 2)).collect();
        let sorted: BTreeMap<u32, u32> = forward.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(
            Shape::of(&forward).unwrap(),
            Shape::of(&sorted).unwrap(),
            "a map's order is not its value"
        );
        let set: std::collections::HashSet<String> = (0..64).map(|i| format!("v{i}")).collect();
        // Another set of the same strings, with its own hasher: another order.
        let copy: std::collections::HashSet<String> =
            (0..64).rev().map(|i| format!("v{i}")).collect();
        assert_eq!(
            Shape::of(&set).unwrap(),
            Shape::of(&copy).unwrap(),
            "nor is a set's"
        );
        assert_ne!(
            Shape::of(&(1, 2)).unwrap(),
            Shape::of(&(2, 1)).unwrap(),
            "a tuple's is"
        );
    }
}
