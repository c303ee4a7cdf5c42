//! Checks the template against the handler and writes the wrapper.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt as _;
use syn::{Ident, LitStr};

use crate::args::Args;
use crate::errors::{Errors, did_you_mean};
use crate::signature::{Handler, param_span};
use crate::template::{self, Piece, Placeholder, Segment, Template};

/// Parses the key template and checks every placeholder against the handler's parameters.
pub fn check_template(
    key: &LitStr,
    args: &Args,
    handler: Option<&Handler<'_>>,
    errors: &mut Errors,
) -> Option<Template> {
    let source = key.value();
    let template = match template::parse(&source) {
        Ok(template) => template,
        Err(template_errors) => {
            for error in template_errors {
                errors.push(syn::Error::new(
                    key.span(),
                    format!("in key template `{source}`: {}", error.message),
                ));
            }
            return None;
        }
    };

    if template.placeholders().next().is_none() && args.once.is_none() {
        errors.push(syn::Error::new(
            key.span(),
            format!(
                "the key `{source}` has no placeholder, so every call would share one key and the job would run only once, ever. Add the inputs that identify one unit of work (`{source}:<customer_id>`), or add `once` to the attribute if that is what you want"
            ),
        ));
    }
    if args.once.is_some() && template.placeholders().next().is_some() {
        errors.push(syn::Error::new(
            args.once.unwrap_or_else(Span::call_site),
            "`once` is for a key with no placeholders; this key has some, so leave `once` out",
        ));
    }

    let handler = handler?;
    let names: Vec<String> = handler
        .params
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != handler.conn)
        .map(|(_, p)| p.ident.unraw().to_string())
        .collect();
    let mut ok = true;
    for placeholder in template.placeholders() {
        if let Err(message) = check_placeholder(placeholder, handler, &names) {
            errors.push(syn::Error::new(
                key.span(),
                format!("in key template `{source}`: {message}"),
            ));
            ok = false;
        }
    }
    ok.then_some(template)
}

fn check_placeholder(
    placeholder: &Placeholder,
    handler: &Handler<'_>,
    names: &[String],
) -> Result<(), String> {
    let shown = placeholder.display();
    let root = placeholder.root();
    let function = &handler.item.sig.ident;
    if root == "self" {
        if handler.receiver.is_none() {
            return Err(format!(
                "`{shown}`: `{function}` is not a method, so there is no `self`"
            ));
        }
        if placeholder.path.len() == 1 {
            return Err(
                "`<self>` names the whole receiver; name a field of it instead, like `<self.id>`"
                    .to_owned(),
            );
        }
        return Ok(());
    }
    let conn = &handler.conn().ident;
    if conn.unraw() == root {
        return Err(format!(
            "`{shown}` names the connection parameter `{conn}`; a key is built from the job's inputs, not from the connection"
        ));
    }
    if names.iter().any(|name| name == root) {
        return Ok(());
    }
    let mut message =
        format!("unknown placeholder `{shown}`: `{function}` has no parameter `{root}`");
    if let Some(suggestion) = did_you_mean(root, names.iter().map(String::as_str)) {
        message.push_str(&format!("; did you mean `{suggestion}`?"));
    } else if names.is_empty() {
        message.push_str(" (it has no parameters besides the connection)");
    } else {
        message.push_str(&format!(
            "; its parameters are {}",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Err(message)
}

/// Everything the wrapper is generated from.
pub struct Expansion<'a> {
    pub handler: &'a Handler<'a>,
    pub template: &'a Template,
    pub key: &'a LitStr,
    pub args: &'a Args,
}

impl Expansion<'_> {
    pub fn expand(&self) -> TokenStream {
        let item = self.handler.item;
        let attrs = &item.attrs;
        let vis = &item.vis;
        let sig = &item.sig;
        let body = &item.body;
        let krate = self.krate();
        let mixed = Span::mixed_site();
        let key_var = Ident::new("__idempotent_key", mixed);
        let writer = Ident::new("__idempotent_writer", mixed);
        let store = Ident::new("__idempotent_conn", mixed);

        let job = self.job(&krate);
        let build_key = self.build_key(&krate, &writer);
        let conn = &self.handler.conn().ident;
        let output = match &sig.output {
            syn::ReturnType::Type(_, ty) => quote!(#ty),
            syn::ReturnType::Default => quote!(()),
        };

        // The original block sits unchanged inside the closure; its parameter rebinds the
        // connection under the user's own name and type, so the body reads exactly as written.
        quote! {
            #(#attrs)*
            #vis #sig {
                let #key_var = {
                    #build_key
                };
                #krate::__private::run_with(
                    #conn,
                    |#store| {
                        use #krate::__private::AsJobStore as _;
                        #store.__idempotent_store()
                    },
                    #job,
                    &#key_var,
                    move |#conn| -> #output #body,
                )
                .map(#krate::__private::Outcome::into_inner)
            }
        }
    }

    fn krate(&self) -> TokenStream {
        match &self.args.krate {
            Some(path) => quote!(#path),
            None => quote!(::idempotent),
        }
    }

    fn job(&self, krate: &TokenStream) -> TokenStream {
        let name = match &self.args.name {
            Some(name) => name.value(),
            None => self.handler.item.sig.ident.unraw().to_string(),
        };
        let template = self.key.value();
        quote! {
            const { &#krate::__private::Job::new(#name, #template) }
        }
    }

    fn build_key(&self, krate: &TokenStream, writer: &Ident) -> TokenStream {
        let escapes = self.template.escapes();
        let capacity: usize = self
            .template
            .pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.len(),
                Piece::Placeholder(_) => 16,
            })
            .sum();
        let pushes = self.template.pieces.iter().map(|piece| match piece {
            Piece::Text(text) => quote! { #writer.text(#text); },
            Piece::Placeholder(placeholder) => {
                let (value, span) = self.value_expr(placeholder);
                // Spanned at the parameter, so "does not implement `Display`" points at it.
                quote_spanned! {span=>
                    #krate::__private::KeyValue::write_key(&#value, &mut #writer);
                }
            }
        });
        quote! {
            let mut #writer = #krate::__private::KeyWriter::new(#capacity, &[#(#escapes),*]);
            #(#pushes)*
            #writer.finish()
        }
    }

    /// The expression for a placeholder's value, and the span to blame for it.
    fn value_expr(&self, placeholder: &Placeholder) -> (TokenStream, Span) {
        let mut segments = placeholder.path.iter();
        let (mut expr, span) = match segments.next() {
            Some(Segment::Name(root)) if root == "self" => {
                let receiver = self
                    .handler
                    .receiver
                    .map_or_else(Span::call_site, |r| r.self_token.span);
                let token = Ident::new("self", receiver);
                (quote!(#token), receiver)
            }
            Some(Segment::Name(root)) => {
                let param = self
                    .handler
                    .params
                    .iter()
                    .find(|p| p.ident.unraw() == root.as_str());
                match param {
                    Some(param) => {
                        let ident = &param.ident;
                        (quote!(#ident), param_span(param))
                    }
                    None => (quote!(#root), Span::call_site()),
                }
            }
            _ => (quote!(), Span::call_site()),
        };
        for segment in segments {
            match segment {
                Segment::Name(name) => {
                    let field = if template::is_keyword(name) {
                        Ident::new_raw(name, self.key.span())
                    } else {
                        format_ident!("{}", name, span = self.key.span())
                    };
                    expr = quote!(#expr.#field);
                }
                Segment::Index(index) => {
                    let index = syn::Index {
                        index: *index,
                        span: self.key.span(),
                    };
                    expr = quote!(#expr.#index);
                }
            }
        }
        (expr, span)
    }
}
