//! A key built from a handler's inputs: its template (`invoice:<month>:<customer_id>`) and one value
//! per placeholder, escaped exactly as the handler's companion `handler::key(..)` escapes them.

use idempotent_keys::template::{self, Piece};
use idempotent_runtime::JobKey;

/// The placeholders of `template`, as written (`<month>`), or what is wrong with it.
pub fn placeholders(source: &str) -> Result<Vec<String>, String> {
    let (parsed, errors) = template::parse(source);
    if !errors.is_empty() {
        return Err(errors
            .iter()
            .map(|e| e.message.as_str())
            .collect::<Vec<_>>()
            .join("; "));
    }
    Ok(parsed.placeholders().map(|p| p.display()).collect())
}

/// The key the template gives with these values, one per placeholder in order.
pub fn key_from_template(source: &str, values: &[String]) -> Result<JobKey, String> {
    let names = placeholders(source)?;
    if names.len() != values.len() {
        return Err(format!(
            "the template `{source}` has {} placeholder{} ({}): give one value for each, in order; {} given",
            names.len(),
            if names.len() == 1 { "" } else { "s" },
            names.join(", "),
            values.len()
        ));
    }
    let (parsed, _) = template::parse(source);
    let mut builder = JobKey::builder();
    let mut values = values.iter();
    for piece in &parsed.pieces {
        builder = match piece {
            Piece::Text(text) => builder.text(text),
            Piece::Placeholder(_) => match values.next() {
                Some(value) => builder.value(value),
                None => builder,
            },
        };
    }
    builder.build().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_as_the_companion_escapes_them() {
        let key = |values: &[&str]| {
            let values: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
            key_from_template("invoice:<month>:<customer_id>", &values)
                .map(|key| key.as_str().to_owned())
        };
        assert_eq!(key(&["a:b", "c"]).as_deref(), Ok("invoice:a%3Ab:c"));
        assert_eq!(key(&["a", "b:c"]).as_deref(), Ok("invoice:a:b%3Ac"));
        assert_eq!(key(&["100%", "東京"]).as_deref(), Ok("invoice:100%25:東京"));
        let error = key(&["a"]).expect_err("one value short");
        assert!(error.contains("<month>, <customer_id>"), "{error}");
        assert!(placeholders("invoice:<month><id>").is_err());
    }
}
