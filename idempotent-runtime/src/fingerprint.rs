//! Input fingerprints: the inputs that must match when a key comes back.
//!
//! A key says *which* unit of work a call is (the charge for order 42); a fingerprint says *what*
//! it was asked to do (4200 cents, in EUR). A replay whose fingerprint differs from the first run's
//! is almost always a bug (a reused order id, a retry with edited data), so it is an
//! [`Error::FingerprintMismatch`](crate::error::Error::FingerprintMismatch) instead of a silent replay of
//! the old result.
//!
//! # How a fingerprint is computed
//!
//! Each input is serialized with serde into a JSON value; the inputs form one JSON object keyed by
//! their names; that object is written in canonical form (object keys sorted at every depth, no
//! whitespace, serde_json's number formatting) and hashed with SHA-256. So:
//!
//! * the order in which inputs are named, and the iteration order of maps inside them (a
//!   `HashMap`), do not matter, whatever serde_json features the build enables; nor the order of
//!   a set that is an input itself (a parameter of type `HashSet`, [`Unordered`]). A `HashSet`
//!   inside an input (a field of a struct) is written in its own order, which differs from one
//!   set to the next: make it a `BTreeSet`;
//! * formatting does not matter: there is none;
//! * the value's type does: `1_i64` is `1` and `1.0_f64` is `1.0`, so changing an input's type from
//!   integer to float changes the fingerprint. Strings are compared as written (no Unicode
//!   normalization).
//! * a float that is NaN or infinite, anywhere inside an input, is refused: JSON has no such
//!   number, and serde_json would write it as `null`, so NaN, both infinities and `None` would give
//!   one fingerprint.
//! * a key that comes twice in one object (a `#[serde(flatten)]` map's beside a field of that
//!   name) is refused: JSON keeps only one of the two.
//! * `Some(None)`, `Some(())` and `None` are all `null`, and give one fingerprint: where the
//!   difference matters ("set to nothing" against "left alone"), make the input an enum.
//!
//! Only the digest is stored, never the inputs, so fingerprints may cover personal data.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

// Why [`FiniteFloats`] refused a value.
use crate::shape::NoShape as NotFinite;

/// The SHA-256 of a job call's canonical inputs; see the [module docs](self).
///
/// Stored with it, the SHA-256 of the inputs' names alone: where a redelivery's fingerprint
/// covers other inputs than the stored one (a deploy gave the job's `fingerprint(...)` another
/// input, or renamed one), the two cannot be compared, and are not, as a row stored before the job
/// had a fingerprint is not: before, every such key failed with `FingerprintMismatch` for ever.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    digest: [u8; 32],
    names: [u8; 32],
}

/// How a stored fingerprint compares with a call's ([`Fingerprint::compare_stored`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compared {
    /// The same inputs, with the same values.
    Same,
    /// The same inputs, with other values (or values that serialize otherwise).
    Differs,
    /// Other inputs (by name): the job's fingerprint changed since the row was stored.
    OtherInputs,
}

impl Fingerprint {
    /// Starts a fingerprint.
    ///
    /// ```
    /// use idempotent_runtime::fingerprint::Fingerprint;
    ///
    /// let a = Fingerprint::builder().input("amount", &4200).input("currency", "EUR").finish()?;
    /// let b = Fingerprint::builder().input("currency", "EUR").input("amount", &4200).finish()?;
    /// assert_eq!(a, b);
    /// # Ok::<(), idempotent_runtime::fingerprint::FingerprintError>(())
    /// ```
    pub fn builder() -> FingerprintBuilder {
        FingerprintBuilder::default()
    }

    /// The digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.digest
    }

    /// What `done_jobs.fingerprint` holds: the digest, then the digest of the inputs' names.
    pub(crate) fn stored(&self) -> [u8; 64] {
        let mut stored = [0; 64];
        stored[..32].copy_from_slice(&self.digest);
        stored[32..].copy_from_slice(&self.names);
        stored
    }

    /// How `stored` (a row's fingerprint: [`stored`](Self::stored), or a digest alone, as written
    /// before the names were) compares with this one.
    pub(crate) fn compare_stored(&self, stored: &[u8]) -> Compared {
        let (digest, names) = stored.split_at(stored.len().min(32));
        if names.len() == 32 && names != self.names {
            Compared::OtherInputs
        } else if digest == self.digest {
            Compared::Same
        } else {
            Compared::Differs
        }
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint(")?;
        for byte in &self.digest[..8] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "…)")
    }
}

/// Collects named inputs; see [`Fingerprint::builder`].
#[derive(Debug, Default)]
pub struct FingerprintBuilder {
    inputs: BTreeMap<String, Value>,
    error: Option<FingerprintError>,
}

/// An input that could not be serialized.
#[derive(Debug, thiserror::Error)]
#[error("the fingerprint input `{input}` could not be serialized: {source}")]
pub struct FingerprintError {
    /// The input's name.
    pub input: String,
    /// serde_json's error.
    #[source]
    pub source: serde_json::Error,
}

impl FingerprintBuilder {
    /// Adds an input under `name`. An input that cannot be serialized, or holds a NaN or infinite
    /// float, makes [`finish`](Self::finish) fail.
    pub fn input<T: Serialize + ?Sized>(mut self, name: &str, value: &T) -> Self {
        if self.error.is_none() {
            match refuse_non_finite(value).and_then(|()| serde_json::to_value(value)) {
                Ok(value) => {
                    self.inputs.insert(name.to_owned(), value);
                }
                Err(source) => {
                    self.error = Some(FingerprintError {
                        input: name.to_owned(),
                        source,
                    });
                }
            }
        }
        self
    }

    /// The fingerprint, or the first input that failed.
    pub fn finish(self) -> Result<Fingerprint, FingerprintError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        // The names, sorted (the map's order), each followed by a NUL, which no name contains
        // that serde_json would write as itself.
        let mut names = Sha256::new();
        for name in self.inputs.keys() {
            names.update(name.as_bytes());
            names.update([0]);
        }
        let mut canonical = String::new();
        write_canonical(
            &mut canonical,
            &Value::Object(self.inputs.into_iter().collect()),
        );
        Ok(Fingerprint {
            digest: Sha256::digest(canonical.as_bytes()).into(),
            names: names.finalize().into(),
        })
    }
}

/// A set's elements, serialized in the order of their canonical form rather than the set's own:
/// each `HashSet` iterates in an order of its own, so an equal set built again (a redelivered
/// message decoded) gave another fingerprint, and every redelivery failed. `#[idempotent_job]`
/// wraps a fingerprint input in it where the parameter's type is a `HashSet` (also `FxHashSet`,
/// `AHashSet`); a set inside another input keeps its own order (use a `BTreeSet` there).
pub struct Unordered<'a, S: ?Sized>(pub &'a S);

impl<'a, S: ?Sized> Serialize for Unordered<'a, S>
where
    &'a S: IntoIterator,
    <&'a S as IntoIterator>::Item: Serialize,
{
    fn serialize<Z: serde::Serializer>(&self, serializer: Z) -> Result<Z::Ok, Z::Error> {
        use serde::ser::Error as _;
        let mut items = Vec::new();
        for item in self.0 {
            refuse_non_finite(&item).map_err(Z::Error::custom)?;
            let value = serde_json::to_value(&item).map_err(Z::Error::custom)?;
            let mut canonical = String::new();
            write_canonical(&mut canonical, &value);
            items.push((canonical, value));
        }
        items.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        serializer.collect_seq(items.iter().map(|(_, value)| value))
    }
}

/// Refuses a value that holds a NaN or infinite float anywhere: JSON writes it as `null`, which
/// reads back as `None` inside an `Option` (a stored result would replay as another value).
pub(crate) fn refuse_non_finite<T: Serialize + ?Sized>(value: &T) -> Result<(), serde_json::Error> {
    value
        .serialize(FiniteFloats)
        .map_err(<serde_json::Error as serde::ser::Error>::custom)
}

/// A serializer that writes nothing and fails on a NaN or infinite float anywhere in the value.
struct FiniteFloats;

fn check_float(value: f64) -> Result<(), NotFinite> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(NotFinite(format!(
            "it holds the float {value}, which JSON cannot represent (it would be stored as null, the same as None and every other non-finite float)"
        )))
    }
}

/// A scalar with no float in it: accepted.
macro_rules! accept {
    ($($method:ident($($arg:ty),*);)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<(), NotFinite> { Ok(()) })*
    };
}

/// A compound value's start: its parts are checked one by one as they come.
macro_rules! descend {
    ($($method:ident($($arg:ty),*);)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<Self, NotFinite> { Ok(self) })*
    };
}

impl serde::Serializer for FiniteFloats {
    type Ok = ();
    type Error = NotFinite;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = MapKeys;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    accept! {
        serialize_bool(bool);
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_i128(i128);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
        serialize_u128(u128);
        serialize_char(char);
        serialize_str(&str);
        serialize_bytes(&[u8]);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(&'static str);
        serialize_unit_variant(&'static str, u32, &'static str);
    }

    fn serialize_f32(self, value: f32) -> Result<(), NotFinite> {
        check_float(f64::from(value))
    }

    fn serialize_f64(self, value: f64) -> Result<(), NotFinite> {
        check_float(value)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), NotFinite> {
        value.serialize(self)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), NotFinite> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Result<(), NotFinite> {
        value.serialize(self)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<MapKeys, NotFinite> {
        Ok(MapKeys::default())
    }

    descend! {
        serialize_seq(Option<usize>);
        serialize_tuple(usize);
        serialize_tuple_struct(&'static str, usize);
        serialize_tuple_variant(&'static str, u32, &'static str, usize);
        serialize_struct(&'static str, usize);
        serialize_struct_variant(&'static str, u32, &'static str, usize);
    }
}

macro_rules! compound {
    ($($trait:ident { $($method:ident($($name:ident: $arg:ty),*);)* })*) => {
        $(
            impl serde::ser::$trait for FiniteFloats {
                type Ok = ();
                type Error = NotFinite;
                $(
                    fn $method<T: Serialize + ?Sized>(&mut self, $($name: $arg,)* value: &T) -> Result<(), NotFinite> {
                        $(let _ = $name;)*
                        value.serialize(FiniteFloats)
                    }
                )*
                fn end(self) -> Result<(), NotFinite> {
                    Ok(())
                }
            }
        )*
    };
}

compound! {
    SerializeSeq { serialize_element(); }
    SerializeTuple { serialize_element(); }
    SerializeTupleStruct { serialize_field(); }
    SerializeTupleVariant { serialize_field(); }
    SerializeStruct { serialize_field(key: &'static str); }
    SerializeStructVariant { serialize_field(key: &'static str); }
}

/// A map's keys as JSON writes them, for [`FiniteFloats`]: a key that comes twice with two
/// different values (a `#[serde(flatten)]` field's beside a field of the same name) is refused,
/// since JSON keeps one of the two, and inputs that differ there would give one fingerprint. The
/// same key twice with equal values (a flattened map ahead of a flattened struct: serde hands the
/// map every entry, the struct's too) says one thing, and passes.
#[derive(Default)]
struct MapKeys {
    /// Each key's value, in canonical form.
    seen: std::collections::HashMap<String, String>,
    /// The key whose value comes next.
    pending: Option<String>,
}

impl serde::ser::SerializeMap for MapKeys {
    type Ok = ();
    type Error = NotFinite;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), NotFinite> {
        key.serialize(FiniteFloats)?;
        // serde_json writes a number key as its digits, a string as itself; it refuses another
        // key when the whole value is written.
        self.pending = match serde_json::to_value(key) {
            Ok(Value::String(text)) => Some(text),
            Ok(other) => Some(other.to_string()),
            Err(_) => None,
        };
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotFinite> {
        value.serialize(FiniteFloats)?;
        let (Some(key), Ok(value)) = (self.pending.take(), serde_json::to_value(value)) else {
            return Ok(());
        };
        let mut canonical = String::new();
        write_canonical(&mut canonical, &value);
        match self.seen.insert(key.clone(), canonical.clone()) {
            Some(before) if before != canonical => Err(NotFinite(format!(
                "it holds the key `{key}` twice in one object with two values (a `#[serde(flatten)]` field's beside a field of that name, say), and JSON keeps only one of the two"
            ))),
            _ => Ok(()),
        }
    }

    fn end(self) -> Result<(), NotFinite> {
        Ok(())
    }
}

/// Writes `value` as compact JSON with object keys sorted at every depth.
fn write_canonical(out: &mut String, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(out, value);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, item);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn of<T: Serialize>(value: &T) -> Fingerprint {
        Fingerprint::builder().input("v", value).finish().unwrap()
    }

    /// A key that comes twice in one object (a flattened map's beside a field of that name):
    /// JSON keeps one, and the inputs `amount` 100 and 999999 gave one fingerprint, so the second
    /// call replayed the first's result. Refused now; a set's order does not matter
    /// ([`Unordered`]).
    #[test]
    fn a_key_twice_in_one_object_is_refused_and_sets_have_no_order() {
        #[derive(Serialize)]
        struct Order {
            amount: u64,
            #[serde(flatten)]
            extra: HashMap<String, u64>,
        }
        let order = |amount| Order {
            amount,
            extra: HashMap::from([("amount".to_owned(), 7)]),
        };
        for amount in [100, 999_999] {
            let refused = Fingerprint::builder()
                .input("order", &order(amount))
                .finish();
            assert!(
                refused.as_ref().is_err_and(|e| e
                    .to_string()
                    .contains("the key `amount` twice in one object with two values")),
                "{refused:?}"
            );
        }
        let fine = Order {
            amount: 1,
            extra: HashMap::from([("note".to_owned(), 7)]),
        };
        assert!(
            Fingerprint::builder()
                .input("order", &fine)
                .finish()
                .is_ok()
        );
        // The same key twice with one value (a flattened map ahead of a flattened struct, which
        // hands the map the struct's fields too) says one thing: accepted, as before.
        #[derive(Serialize)]
        struct Meta {
            id: u32,
        }
        #[derive(Serialize)]
        struct Message {
            #[serde(flatten)]
            extra: HashMap<String, u32>,
            #[serde(flatten)]
            meta: Meta,
        }
        let message = Message {
            extra: HashMap::from([("id".to_owned(), 1), ("x".to_owned(), 2)]),
            meta: Meta { id: 1 },
        };
        assert!(Fingerprint::builder().input("m", &message).finish().is_ok());
        let a: std::collections::HashSet<u32> = (0..50).collect();
        let b: std::collections::HashSet<u32> = (0..50).rev().collect();
        assert_eq!(of(&Unordered(&a)), of(&Unordered(&b)));
        assert_ne!(
            of(&Unordered(&a)),
            of(&Unordered(&(0..49).collect::<Vec<u32>>()))
        );
    }

    #[test]
    fn map_order_does_not_matter() {
        let a: HashMap<String, u32> = (0..50).map(|i| (format!("k{i}"), i)).collect();
        let b: HashMap<String, u32> = (0..50).rev().map(|i| (format!("k{i}"), i)).collect();
        assert_eq!(of(&a), of(&b));
        let c: BTreeMap<String, u32> = a.clone().into_iter().collect();
        assert_eq!(
            of(&a),
            of(&c),
            "a HashMap and a BTreeMap with the same entries agree"
        );
    }

    #[test]
    fn values_and_names_matter() {
        assert_ne!(of(&4200), of(&4201));
        assert_ne!(
            Fingerprint::builder().input("a", &1).finish().unwrap(),
            Fingerprint::builder().input("b", &1).finish().unwrap()
        );
        assert_ne!(
            of(&1_i64),
            of(&1.0_f64),
            "the type of a number is part of the input"
        );
    }

    #[test]
    fn non_finite_floats_are_refused_anywhere_in_an_input() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let error = Fingerprint::builder()
                .input("amount", &bad)
                .finish()
                .unwrap_err();
            assert_eq!(error.input, "amount");
            assert!(
                error.to_string().contains("JSON cannot represent"),
                "{error}"
            );
            let nested = vec![(1, Some(vec![2.5, bad]))];
            assert!(
                Fingerprint::builder()
                    .input("lines", &nested)
                    .finish()
                    .is_err()
            );
        }
        assert!(
            Fingerprint::builder()
                .input("amount", &f32::NAN)
                .finish()
                .is_err()
        );
        assert_ne!(of(&Some(1.5)), of(&None::<f64>));
    }

    #[test]
    fn unserializable_inputs_are_reported_by_name() {
        let mut bad = HashMap::new();
        bad.insert((1, 2), "tuple keys are not JSON");
        let error = Fingerprint::builder()
            .input("lines", &bad)
            .finish()
            .unwrap_err();
        assert_eq!(error.input, "lines");
    }
}
