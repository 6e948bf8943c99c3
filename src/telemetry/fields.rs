//! The text log's span and event fields, as `DefaultFields` writes them, for
//! less: `DefaultFields` writes each field with one `write!` of three
//! arguments (the name and `=` in their ANSI styles, then the value), about
//! 1,500 instructions a field, so the `request` span every miss makes cost
//! 4,400 instructions (BENCHMARKS.md, issue 41) before anything was logged.
//! Without ANSI styles, [`PlainFields`] writes the name and `=` as they are
//! and formats only the value: the same bytes. Whatever else `DefaultFields`
//! treats specially (ANSI styles, `message`, errors, `r#` names, `log.`
//! metadata) is handed to its own visitor, so those read as they always did.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::{
    field::{MakeVisitor, VisitFmt, VisitOutput},
    fmt::format::{DefaultVisitor, Writer},
};

/// `DefaultFields`' output, written for less. See the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct PlainFields;

impl<'a> MakeVisitor<Writer<'a>> for PlainFields {
    type Visitor = PlainVisitor<'a>;

    fn make_visitor(&self, target: Writer<'a>) -> Self::Visitor {
        PlainVisitor {
            writer: target,
            is_empty: true,
            result: Ok(()),
        }
    }
}

/// Writes one span's or event's fields (see [`PlainFields`]).
pub struct PlainVisitor<'a> {
    writer: Writer<'a>,
    /// No field written yet: the next needs no separating space.
    is_empty: bool,
    result: fmt::Result,
}

/// How one field is written.
enum Writing {
    /// A `log.` field: metadata, which `DefaultVisitor` never writes either.
    Nothing,
    /// `name=value`, with no style.
    Plain,
    /// As `DefaultVisitor` writes it (ANSI styles, `message`, `r#` names).
    Default,
}

impl PlainVisitor<'_> {
    fn writing(&self, name: &str) -> Writing {
        if name.starts_with("log.") {
            Writing::Nothing
        } else if self.writer.has_ansi_escapes() || name == "message" || name.starts_with("r#") {
            Writing::Default
        } else {
            Writing::Plain
        }
    }

    /// `name=value`, after a space when a field came before.
    fn plain(&mut self, name: &str, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        if !std::mem::take(&mut self.is_empty) {
            self.result = self.writer.write_char(' ');
        }
        self.result = self
            .result
            .and_then(|()| self.writer.write_str(name))
            .and_then(|()| self.writer.write_char('='))
            .and_then(|()| write!(self.writer, "{value:?}"));
    }

    /// `DefaultVisitor`'s own writing of one field, after the fields before it.
    fn as_default(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        let mut default = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut default);
        let result = default.finish();
        // It wrote the field, so the next one needs its space.
        self.is_empty = false;
        self.result = self.result.and(result);
    }
}

impl Visit for PlainVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        match self.writing(field.name()) {
            Writing::Nothing => {}
            Writing::Plain => self.plain(field.name(), &value),
            Writing::Default => self.as_default(|default| default.record_str(field, value)),
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        match self.writing(field.name()) {
            Writing::Nothing => {}
            Writing::Plain | Writing::Default => {
                self.as_default(|default| default.record_error(field, value));
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match self.writing(field.name()) {
            Writing::Nothing => {}
            Writing::Plain => self.plain(field.name(), value),
            Writing::Default => self.as_default(|default| default.record_debug(field, value)),
        }
    }
}

impl VisitOutput<fmt::Result> for PlainVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for PlainVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::{fmt::MakeWriter, layer::SubscriberExt};

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;
        fn make_writer(&'a self) -> Lines {
            self.clone()
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    /// Spans and events of every kind of field, in order, with or without
    /// a message, the way the gateway logs them.
    fn log_everything() {
        let request_id = "req-\"7\"";
        let span = tracing::info_span!(
            "request",
            request_id = %request_id,
            method = %"POST",
            path = %format_args!("/v1{}", "/chat/completions"),
        );
        let _entered = span.enter();
        let inner = tracing::info_span!("flight", key = ?[1u8, 2], r#type = "chat", empty = "");
        let _inner = inner.enter();
        tracing::warn!(
            upstream = "mock",
            status = 429u16,
            wait_ms = 1.5,
            quiet = true,
            "provider said \"slow down\""
        );
        tracing::info!(reason = %"multi\nline", count = -3i64);
        tracing::error!(
            error = &Outer(std::io::Error::other("inner")) as &dyn std::error::Error,
            "call failed"
        );
        tracing::info!(message = "only a message");
        tracing::info!(log.target = "ignored", after = "log metadata");
    }

    fn lines_with(plain: bool, ansi: bool) -> String {
        let lines = Lines::default();
        let layer = tracing_subscriber::fmt::layer()
            .without_time()
            .with_target(false)
            .with_ansi(ansi)
            .with_writer(lines.clone());
        if plain {
            let subscriber = tracing_subscriber::registry().with(layer.fmt_fields(PlainFields));
            tracing::subscriber::with_default(subscriber, log_everything);
        } else {
            let subscriber = tracing_subscriber::registry().with(layer);
            tracing::subscriber::with_default(subscriber, log_everything);
        }
        String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn plain_fields_write_what_default_fields_write() {
        for ansi in [false, true] {
            let default = lines_with(false, ansi);
            assert_eq!(
                default.lines().count(),
                6,
                "five events, one on two lines: {default}"
            );
            assert_eq!(lines_with(true, ansi), default, "ansi: {ansi}");
        }
        let text = lines_with(true, false);
        assert!(
            text.contains(
                r#"request{request_id=req-"7" method=POST path=/v1/chat/completions}:flight{key=[1, 2] type="chat" empty=""}"#
            ),
            "{text}"
        );
    }
}
