//! `srptd`'s log: records with an event name, where it happened (target,
//! session) and its details, written one per line as text for a person
//! (the default, `srptd: <message>`) or as a JSON object for a log
//! collector (`--log-format json`):
//!
//! ```json
//! {"ts":"2026-11-26T13:20:01.123Z","level":"info","event":"login_accepted",
//!  "target":"fe80:...","session":"0x...","fields":{"channel":1},"msg":"login from ..."}
//! ```
//!
//! Every line of the JSON form is one record, the announcements scripts
//! wait for (`target_listening`, `metrics_listening`) included. The level
//! is a threshold that `srptadm set log-level` changes at runtime, as
//! SCST's `trace_level` does; admin queries are logged at `debug`.
//! The libraries' `tracing` events (the SRP target's, the access
//! layer's, the NIC's) come into the same log through [`Bridge`], at the
//! same level.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// How important a record is; a logger writes those at or above its level.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }

    fn from_u8(n: u8) -> Level {
        match n {
            0 => Level::Debug,
            1 => Level::Info,
            2 => Level::Warn,
            _ => Level::Error,
        }
    }
}

/// A log level other than debug, info, warn or error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("log level `{0}`: expected debug, info, warn or error")]
pub struct LevelError(pub String);

impl std::str::FromStr for Level {
    type Err = LevelError;
    fn from_str(s: &str) -> Result<Level, LevelError> {
        <Level as clap::ValueEnum>::from_str(s, true).map_err(|_| LevelError(s.to_string()))
    }
}

/// How records are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// `srptd: <message>`, for a person.
    #[default]
    Text,
    /// One JSON object per line: ts, level, event, target, session,
    /// fields, msg.
    Json,
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub level: Level,
    /// What happened, in snake case: `login_accepted`, `lun_added`, ...
    pub event: std::borrow::Cow<'static, str>,
    /// The target (its name) it happened at, if any.
    pub target: Option<String>,
    /// The session (initiator name) it concerns, if any.
    pub session: Option<String>,
    /// The details, for machines.
    pub fields: Map<String, Value>,
    /// The line a person reads.
    pub msg: String,
}

impl Record {
    pub fn new(level: Level, event: &'static str, msg: impl Into<String>) -> Record {
        Record {
            level,
            event: event.into(),
            target: None,
            session: None,
            fields: Map::new(),
            msg: msg.into(),
        }
    }

    pub fn info(event: &'static str, msg: impl Into<String>) -> Record {
        Record::new(Level::Info, event, msg)
    }

    pub fn warn(event: &'static str, msg: impl Into<String>) -> Record {
        Record::new(Level::Warn, event, msg)
    }

    pub fn target(mut self, name: impl Into<String>) -> Record {
        self.target = Some(name.into());
        self
    }

    pub fn session(mut self, name: impl Into<String>) -> Record {
        self.session = Some(name.into());
        self
    }

    pub fn field(mut self, key: &str, v: impl Serialize) -> Record {
        self.fields
            .insert(key.into(), serde_json::to_value(v).unwrap_or(Value::Null));
        self
    }

    /// Adds every member of `v` when it is an object (a request, an
    /// answer).
    pub fn fields_of(mut self, v: &Value) -> Record {
        if let Value::Object(m) = v {
            for (k, x) in m {
                self.fields.insert(k.clone(), x.clone());
            }
        }
        self
    }

    /// The record as one line in `format` (no newline), stamped `at`.
    pub fn line(&self, format: Format, at: SystemTime) -> String {
        match format {
            Format::Text => format!("srptd: {}", self.msg),
            Format::Json => json!({
                "ts": rfc3339(at),
                "level": self.level.name(),
                "event": self.event,
                "target": self.target,
                "session": self.session,
                "fields": self.fields,
                "msg": self.msg,
            })
            .to_string(),
        }
    }
}

/// Where records go: a line writer, a format and a level that can change
/// while the daemon runs.
pub struct Logger {
    format: Format,
    level: AtomicU8,
    sink: Box<dyn Fn(&str) + Send + Sync>,
}

/// A logger shared by the daemon's threads.
pub type Log = std::sync::Arc<Logger>;

impl Logger {
    /// A logger writing each line to `sink`.
    pub fn new(format: Format, level: Level, sink: impl Fn(&str) + Send + Sync + 'static) -> Log {
        std::sync::Arc::new(Logger {
            format,
            level: AtomicU8::new(level as u8),
            sink: Box::new(sink),
        })
    }

    /// A logger writing to standard output, flushed per line (scripts and
    /// collectors read it as it comes).
    pub fn stdout(format: Format, level: Level) -> Log {
        Logger::new(format, level, |line| {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn level(&self) -> Level {
        Level::from_u8(self.level.load(Ordering::Relaxed))
    }

    /// Changes the threshold; returns the previous one.
    pub fn set_level(&self, level: Level) -> Level {
        Level::from_u8(self.level.swap(level as u8, Ordering::Relaxed))
    }

    /// Writes `r` if its level is at or above the threshold.
    pub fn emit(&self, r: Record) {
        if r.level >= self.level() {
            (self.sink)(&r.line(self.format, SystemTime::now()));
        }
    }
}

/// The libraries' `tracing` events and spans as srptd's records: a
/// `tracing_subscriber` layer that hands each event at or above the
/// logger's level (read at every event, so `srptadm set log-level`
/// reaches the libraries too) to [`Logger::emit`], in the format srptd
/// writes. An event's `event` field names it (else its tracing target,
/// the module it came from); the fields `target` (or `port`) and
/// `session` (or `initiator`), of the event or of a span it is in
/// (innermost first), fill the record's; the
/// other fields of the event and its spans are the record's details, and
/// the text form appends them to the message.
pub struct Bridge {
    log: Log,
}

impl Bridge {
    /// A layer writing through `log`.
    pub fn new(log: Log) -> Bridge {
        Bridge { log }
    }

    /// Makes the bridge the process's `tracing` subscriber. Returns
    /// whether it was installed (there can be only one per process).
    pub fn install(log: Log) -> bool {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry().with(Bridge::new(log));
        tracing::subscriber::set_global_default(subscriber).is_ok()
    }
}

fn level_of(l: &tracing::Level) -> Level {
    match *l {
        tracing::Level::ERROR => Level::Error,
        tracing::Level::WARN => Level::Warn,
        tracing::Level::INFO => Level::Info,
        _ => Level::Debug,
    }
}

/// The fields of an event or a span, as JSON.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    map: Map<String, Value>,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.put(field, Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.put(field, value.into());
    }
}

impl Fields {
    fn put(&mut self, field: &tracing::field::Field, v: Value) {
        if field.name() == "message" {
            self.message = Some(match v {
                Value::String(s) => s,
                v => v.to_string(),
            });
        } else {
            self.map.insert(field.name().to_string(), v);
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for Bridge
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    // Asked at every event, not once per call site: the level changes
    // while the daemon runs.
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }

    fn enabled(
        &self,
        meta: &tracing::Metadata<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        level_of(meta.level()) >= self.log.level()
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(f.map);
        }
    }

    fn on_event(&self, ev: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let meta = ev.metadata();
        let mut f = Fields::default();
        ev.record(&mut f);
        // Span fields, innermost first, where the event has none of its own.
        if let Some(scope) = ctx.event_scope(ev) {
            for span in scope {
                if let Some(m) = span.extensions().get::<Map<String, Value>>() {
                    for (k, v) in m {
                        f.map.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
        }
        let text = |v: Value| match v {
            Value::String(s) => s,
            v => v.to_string(),
        };
        let event = f.map.remove("event").map(text);
        // srp-target's channel span names the target port `port` and the
        // session `initiator`.
        let target = f
            .map
            .remove("target")
            .or_else(|| f.map.remove("port"))
            .map(text);
        let session = f
            .map
            .remove("session")
            .or_else(|| f.map.remove("initiator"))
            .map(text);
        let mut msg = f.message.unwrap_or_default();
        if self.log.format() == Format::Text && !f.map.is_empty() {
            let details: Vec<String> = f
                .map
                .iter()
                .map(|(k, v)| format!("{k}={}", text(v.clone())))
                .collect();
            msg = format!("{msg} ({})", details.join(", "));
        }
        let mut r = Record::new(level_of(meta.level()), "", msg);
        r.event = event.unwrap_or_else(|| meta.target().to_string()).into();
        r.target = target;
        r.session = session;
        r.fields = f.map;
        self.log.emit(r);
    }
}

/// `t` as RFC 3339 UTC with milliseconds, `2026-11-26T13:20:01.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |s: u64, ms: u64| rfc3339(UNIX_EPOCH + Duration::from_millis(s * 1000 + ms));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        // `date -u -d @951782400`: the leap day of a century leap year.
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(1_795_700_401, 999), "2026-11-26T13:40:01.999Z");
        assert_eq!(at(4_107_542_399, 0), "2100-02-28T23:59:59.000Z");
    }

    #[test]
    fn json_lines_carry_every_part_and_the_level_filters() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l2 = lines.clone();
        let log = Logger::new(Format::Json, Level::Info, move |s| {
            l2.lock().unwrap().push(s.to_string())
        });
        log.emit(
            Record::info("login_accepted", "login accepted")
                .target("t0")
                .session("0xaa")
                .field("channel", 3),
        );
        log.emit(Record::new(Level::Debug, "admin_query", "show"));
        assert_eq!(log.set_level(Level::Debug), Level::Info);
        log.emit(Record::new(Level::Debug, "admin_query", "show"));
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 2, "{lines:?}");
        let v: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(v["event"], "login_accepted");
        assert_eq!(v["level"], "info");
        assert_eq!(
            (v["target"].as_str(), v["session"].as_str()),
            (Some("t0"), Some("0xaa"))
        );
        assert_eq!(v["fields"]["channel"], 3);
        assert!(v["ts"].as_str().unwrap().ends_with('Z'));
        let v: Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(
            (v["level"].as_str(), v["target"].is_null()),
            (Some("debug"), true)
        );
        let text = Record::warn("x", "something").line(Format::Text, SystemTime::now());
        assert_eq!(text, "srptd: something");
        assert!("loud".parse::<Level>().is_err());
        assert_eq!("WARN".parse::<Level>(), Ok(Level::Warn));
    }

    #[test]
    fn library_events_reach_the_log_with_their_spans_and_follow_its_level() {
        use tracing_subscriber::layer::SubscriberExt;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l2 = lines.clone();
        let log = Logger::new(Format::Json, Level::Info, move |s| {
            l2.lock().unwrap().push(s.to_string())
        });
        let subscriber = tracing_subscriber::registry().with(Bridge::new(log.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let span =
                tracing::info_span!("srp_channel", port = "t0", initiator = "0xaa", qpn = 17u64);
            let _in = span.enter();
            tracing::warn!(
                event = "qp_refused",
                why = "bad state",
                "the QP refused a request"
            );
            tracing::debug!("not at info");
            log.set_level(Level::Debug);
            tracing::debug!(credits = 3u64, "now at debug");
        });
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 2, "{lines:?}");
        let v: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(
            (v["event"].as_str(), v["level"].as_str(), v["msg"].as_str()),
            (
                Some("qp_refused"),
                Some("warn"),
                Some("the QP refused a request")
            )
        );
        assert_eq!(
            (v["target"].as_str(), v["session"].as_str()),
            (Some("t0"), Some("0xaa"))
        );
        assert_eq!(
            (&v["fields"]["why"], &v["fields"]["qpn"]),
            (&json!("bad state"), &json!(17))
        );
        let v: Value = serde_json::from_str(&lines[1]).unwrap();
        // No `event` field: the module it came from names it.
        assert_eq!(
            (
                v["event"].as_str(),
                v["level"].as_str(),
                &v["fields"]["credits"]
            ),
            (Some(module_path!()), Some("debug"), &json!(3))
        );
    }

    #[test]
    fn library_events_in_text_carry_their_details() {
        use tracing_subscriber::layer::SubscriberExt;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l2 = lines.clone();
        let log = Logger::new(Format::Text, Level::Info, move |s| {
            l2.lock().unwrap().push(s.to_string())
        });
        let subscriber = tracing_subscriber::registry().with(Bridge::new(log));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(qpn = 5u64, "QP error");
        });
        assert_eq!(*lines.lock().unwrap(), ["srptd: QP error (qpn=5)"]);
    }
}
