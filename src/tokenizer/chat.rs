//! Chat templates: rendering a model's `tokenizer.chat_template` (Jinja)
//! with minijinja, in the environment Hugging Face transformers'
//! `apply_chat_template` gives jinja2 (`trim_blocks`, `lstrip_blocks`, loop
//! controls, `raise_exception`, `strftime_now`, a Python-style `tojson`, and
//! Python string/dict/list methods through minijinja-contrib's pycompat), with
//! llama.cpp's ChatML template (`common/chat.cpp`) for models that carry none.

use std::fmt::Write as _;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use crate::error::{ModelError, Result};

/// The template llama.cpp uses when a model has no `tokenizer.chat_template`.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `"system"`, `"user"`, `"assistant"`, or whatever the template accepts.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Most bytes a rendered conversation may have (far past any context a
/// model takes); a template that writes more is refused, not followed until
/// memory runs out.
pub const MAX_CHAT_OUTPUT: usize = 64 << 20;

/// Instructions a template may execute in one rendering. Real templates
/// spend a few hundred per message; this bounds the time a hostile loop
/// can take (about a second) without cutting long conversations short.
pub const CHAT_TEMPLATE_FUEL: u64 = 50_000_000;

/// Prefix that marks an error raised by the template itself.
const RAISED: &str = "template raised: ";

/// Renders a chat template over `messages`.
///
/// `bos` and `eos` are the texts of the model's BOS and EOS tokens (templates
/// refer to them as `bos_token` / `eos_token`).
///
/// # Errors
/// [`ModelError::Metadata`] (key `tokenizer.chat_template`) when the template
/// does not parse or fails while rendering; [`ModelError::InvalidArgument`]
/// (`messages`) when the template rejects the conversation through
/// `raise_exception` (e.g. roles that do not alternate).
pub fn apply_chat_template(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos: &str,
    eos: &str,
) -> Result<String> {
    let env = environment()?;
    let tmpl = env
        .template_from_str(template)
        .map_err(|e| template_err(&e))?;
    let typed = wants_typed_content(&tmpl, bos, eos);
    let msgs: Vec<Value> = messages
        .iter()
        .map(|m| minijinja::context! { role => m.role.as_str(), content => content_value(&m.content, typed) })
        .collect();
    let ctx = minijinja::context! {
        messages => msgs,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    };
    render_bounded(&tmpl, ctx).map_err(|e| match e {
        Rendered::TooLong => ModelError::Metadata {
            key: "tokenizer.chat_template".into(),
            reason: format!("the rendered conversation exceeds {MAX_CHAT_OUTPUT} bytes"),
        },
        Rendered::Failed(e) => {
            let detail = e.detail().unwrap_or_default();
            match detail.strip_prefix(RAISED) {
                Some(msg) if e.kind() == ErrorKind::InvalidOperation => {
                    ModelError::InvalidArgument {
                        name: "messages",
                        reason: msg.to_string(),
                    }
                }
                _ => template_err(&e),
            }
        }
    })
}

/// Why a bounded rendering gave no text.
enum Rendered {
    /// The output passed [`MAX_CHAT_OUTPUT`].
    TooLong,
    /// The template failed (including running out of fuel).
    Failed(Error),
}

/// Renders `tmpl`, stopping once the output passes [`MAX_CHAT_OUTPUT`].
fn render_bounded(tmpl: &minijinja::Template<'_, '_>, ctx: Value) -> Result<String, Rendered> {
    let mut out = BoundedOutput::default();
    match tmpl.render_captured_to(ctx, &mut out) {
        // The writer only ever receives whole `str` pieces.
        Ok(_) => Ok(String::from_utf8_lossy(&out.bytes).into_owned()),
        Err(_) if out.overflowed => Err(Rendered::TooLong),
        Err(e) => Err(Rendered::Failed(e)),
    }
}

/// The renderer's output, refusing to grow past [`MAX_CHAT_OUTPUT`].
#[derive(Default)]
struct BoundedOutput {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_CHAT_OUTPUT {
            self.overflowed = true;
            return Err(std::io::Error::other("chat template output too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The placeholder a message's text holds where an image goes; templates
/// that take typed content get an `{"type": "image"}` part there.
pub const IMAGE_MARKER: &str = "<image>";

/// Whether the template drops a message whose content is a plain string
/// (multimodal templates such as SmolVLM's iterate over typed parts,
/// `{"type": "text", "text": ...}`), as llama.cpp's template capability
/// probe decides: render a probe text both ways and see which shows it.
fn wants_typed_content(tmpl: &minijinja::Template<'_, '_>, bos: &str, eos: &str) -> bool {
    const PROBE: &str = "combs-probe-7f3a";
    let shows = |content: Value| {
        let msgs = vec![minijinja::context! { role => "user", content => content }];
        render_bounded(
            tmpl,
            minijinja::context! {
                messages => msgs,
                add_generation_prompt => false,
                bos_token => bos,
                eos_token => eos,
            },
        )
        .is_ok_and(|out| out.contains(PROBE))
    };
    !shows(Value::from(PROBE)) && shows(content_value(PROBE, true))
}

/// A message's content: the text itself, or for templates that take typed
/// content its parts — text between [`IMAGE_MARKER`]s, an image part for
/// each marker.
fn content_value(text: &str, typed: bool) -> Value {
    if !typed {
        return Value::from(text);
    }
    let mut parts = Vec::new();
    for (i, piece) in text.split(IMAGE_MARKER).enumerate() {
        if i > 0 {
            parts.push(minijinja::context! { type => "image" });
        }
        if !piece.is_empty() {
            parts.push(minijinja::context! { type => "text", text => piece });
        }
    }
    Value::from(parts)
}

fn template_err(e: &Error) -> ModelError {
    ModelError::Metadata {
        key: "tokenizer.chat_template".into(),
        reason: format!("{e:#}"),
    }
}

fn environment() -> Result<Environment<'static>> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| template_err(&e))?;
    env.set_syntax(syntax);
    env.set_fuel(Some(CHAT_TEMPLATE_FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{RAISED}{msg}"),
        ))
    });
    env.add_function("strftime_now", |fmt: String| strftime_utc_now(&fmt));
    env.add_filter("tojson", tojson);
    Ok(env)
}

/// `json.dumps(value, ensure_ascii=False, indent=..., separators=..., sort_keys=...)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        Some(v) if v.kind() == ValueKind::Number => v.as_i64().map(|n| n.max(0) as usize),
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().map_or(0, str::len)),
        _ => None,
    };
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(s) if s.len() == Some(2) => (
            s.get_item_by_index(0)?.to_string(),
            s.get_item_by_index(1)?.to_string(),
        ),
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let opts = JsonOpts {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    write_json(&value, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    indent: Option<usize>,
    sort_keys: bool,
    ensure_ascii: bool,
    item_sep: String,
    key_sep: String,
}

fn write_json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7E) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn newline(opts: &JsonOpts, level: usize, out: &mut String) {
    if let Some(n) = opts.indent {
        out.push('\n');
        out.push_str(&" ".repeat(n * level));
    }
}

/// Writes the entries of a map or list between its `brackets`, each by
/// `write_item` on its own line one level deeper (when indenting), or just
/// the brackets when there are none.
fn write_json_items(
    items: &[Value],
    brackets: [char; 2],
    opts: &JsonOpts,
    level: usize,
    out: &mut String,
    mut write_item: impl FnMut(&Value, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(brackets[0]);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        newline(opts, level + 1, out);
        write_item(item, out)?;
    }
    if !items.is_empty() {
        newline(opts, level, out);
    }
    out.push(brackets[1]);
    Ok(())
}

fn write_json(v: &Value, opts: &JsonOpts, level: usize, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
                    let _ = write!(out, "{f:.1}");
                } else if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    let _ = write!(out, "{f}");
                }
            }
        }
        ValueKind::String => write_json_str(v.as_str().unwrap_or_default(), opts.ensure_ascii, out),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            write_json_items(&keys, ['{', '}'], opts, level, out, |k, out| {
                write_json_str(&k.to_string(), opts.ensure_ascii, out);
                out.push_str(&opts.key_sep);
                write_json(&v.get_item(k)?, opts, level + 1, out)
            })?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_json_items(&items, ['[', ']'], opts, level, out, |item, out| {
                write_json(item, opts, level + 1, out)
            })?;
        }
        _ => write_json_str(&v.to_string(), opts.ensure_ascii, out),
    }
    Ok(())
}

/// Python's `datetime.now().strftime(fmt)`, in UTC (combs has no time-zone data).
fn strftime_utc_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(fmt, secs)
}

/// `strftime` for a Unix time, UTC, C locale; unknown directives are kept.
fn strftime(fmt: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let is_leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cumulative[(month - 1) as usize] + day + i64::from(is_leap && month > 2);
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[weekday];

    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match d {
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year.rem_euclid(100)),
            'm' => write!(out, "{month:02}"),
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:2}"),
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{:02}", (hour + 11) % 12 + 1),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'j' => write!(out, "{yday:03}"),
            'B' => write!(out, "{month_name}"),
            'b' | 'h' => write!(out, "{}", &month_name[..3]),
            'A' => write!(out, "{day_name}"),
            'a' => write!(out, "{}", &day_name[..3]),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `template` rendered for one user message `content`.
    fn render_user(template: &str, content: &str, add_generation_prompt: bool) -> String {
        let msgs = [ChatMessage::new("user", content)];
        apply_chat_template(template, &msgs, add_generation_prompt, "", "").expect("renders")
    }

    #[test]
    fn strftime_formats_a_known_date() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime("%d %b %Y, %A %j", t), "29 Feb 2024, Thursday 060");
    }

    #[test]
    fn chatml_fallback_renders() {
        let out = render_user(CHATML_TEMPLATE, "Hi", true);
        assert_eq!(
            out,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_is_invalid_argument() {
        let t = "{{ raise_exception('roles must alternate') }}";
        let err = apply_chat_template(t, &[], false, "", "").expect_err("raises");
        assert!(matches!(
            err,
            ModelError::InvalidArgument {
                name: "messages",
                ..
            }
        ));
    }

    #[test]
    fn python_methods_and_tojson_work() {
        let t = "{{ messages[0].content.strip().upper() }}|{{ messages[0] | tojson }}";
        let out = render_user(t, "  hé \"x\"\n ", false);
        assert_eq!(
            out,
            "HÉ \"X\"|{\"role\": \"user\", \"content\": \"  hé \\\"x\\\"\\n \"}"
        );
    }

    #[test]
    fn bad_template_is_metadata_error() {
        let err = apply_chat_template("{% for %}", &[], false, "", "").expect_err("bad");
        assert!(matches!(err, ModelError::Metadata { .. }));
    }
}
