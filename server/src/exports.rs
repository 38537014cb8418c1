//! Exports file parser and per-client access policy.
//!
//! The file format follows the spirit of the Linux `/etc/exports` file:
//!
//! ```text
//! # comment
//! /srv/data      10.0.0.0/8(rw,no_root_squash) *.lab.example(ro) 192.168.1.7
//! "/srv/with space"  (rw)
//! /srv/null      *(rw,null,insecure) \
//!                ::1/128(rw)
//! ```
//!
//! # Lines
//!
//! * Lines are separated by `\n`; a trailing `\r` is ignored.
//! * A backslash as the very last character of a line joins the next line to
//!   it (the backslash and the line break act as a single space).
//! * Outside double quotes, `#` starts a comment that runs to the end of the
//!   (joined) line. Blank and comment-only lines are ignored.
//! * Spaces, tabs, vertical tabs, form feeds and stray carriage returns
//!   separate tokens.
//!
//! # Export path
//!
//! The first token of a line is the exported path. Double quotes may enclose
//! parts of it (so spaces and `#` can appear inside), and `\ooo` (exactly three
//! octal digits naming an ASCII character) inserts that character, e.g.
//! `\040` for a space or `\042` for a double quote. The path must be absolute;
//! it is normalized by collapsing repeated `/`, dropping `.` components and the
//! trailing `/` (except for the root `/`). A `..` component or a NUL character
//! is an error, and every path may be exported only once per file.
//!
//! # Clients
//!
//! The path is followed by zero or more client specifications, each written
//! `CLIENT(OPTIONS)` with no space before the parenthesis, or `CLIENT` alone
//! (default options), or `(OPTIONS)` alone (any host). A path without any
//! client is exported to any host with default options. Client forms:
//!
//! * `*` — any host;
//! * an IPv4 or IPv6 address, e.g. `192.168.1.7` or `fe80::1`;
//! * a network `ADDR/PREFIX` (`10.0.0.0/8`, `::1/128`) or, for IPv4,
//!   `ADDR/DOTTED-MASK` (`192.168.1.0/255.255.255.0`); host bits of the
//!   address are cleared;
//! * a host name pattern made of letters, digits, `-`, `.`, `_` and the
//!   wildcards `*` (any run of characters, dots included) and `?` (exactly one
//!   character). Patterns are matched case-insensitively against the peer's
//!   host name, when the server knows one; they never match otherwise.
//!
//! IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are treated as the IPv4
//! address they carry, both in the file and for connecting peers, so an IPv4
//! rule admits a peer that connected through an IPv6 socket.
//!
//! **Order matters:** the rules of a line are tried from left to right and the
//! first one that matches a peer decides that peer's options; later rules are
//! not consulted.
//!
//! # Options
//!
//! Options are separated by commas; a later option overrides an earlier
//! conflicting one. Recognized options (defaults in bold):
//!
//! | option | meaning |
//! |---|---|
//! | `rw` / **`ro`** | allow writes or not |
//! | **`root_squash`** / `no_root_squash` | map uid/gid 0 to the anonymous ids |
//! | `all_squash` / **`no_all_squash`** | map every user to the anonymous ids |
//! | `anonuid=N`, `anongid=N` | anonymous ids (**65534**) |
//! | **`secure`** / `insecure` | require a source port below 1024 |
//! | **`sync`** / `async` | recorded only |
//! | `subtree_check` / `no_subtree_check` | accepted and ignored |
//! | `fsid=N` (or `fsid=root`, meaning 0) | recorded |
//! | `null` | null export: reads return zeros, writes are discarded |
//! | `nolock` / **`lock`** | NFSv3 locking off: the lock manager (NLM) answers every lock call for this export with NLM4_DENIED_NOLOCKS at once; `lock`, the default, serves it |
//!
//! Any other option is an error naming the option, its line and its column.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Default anonymous user and group id (`nobody` / `nogroup`).
pub const DEFAULT_ANON_ID: u32 = 65534;

/// A parsed exports file: every exported path with its client rules.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Exports {
    /// Exports in file order.
    pub entries: Vec<ExportEntry>,
}

/// One exported path and the clients allowed to mount it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportEntry {
    /// Normalized absolute path.
    pub path: String,
    /// Client rules in file order; the first matching rule wins.
    pub clients: Vec<ClientRule>,
}

/// A client specification together with the options granted to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientRule {
    /// Which peers this rule applies to.
    pub matcher: ClientMatch,
    /// Options for peers that match.
    pub options: ExportOptions,
}

/// Which peers a [`ClientRule`] applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientMatch {
    /// Any peer (`*` or a bare option list).
    Any,
    /// Exactly this address (IPv4-mapped IPv6 addresses are stored as IPv4).
    Addr(IpAddr),
    /// Every address whose first `prefix` bits equal those of `addr`.
    Net {
        /// Network address, with the host bits cleared.
        addr: IpAddr,
        /// Prefix length: at most 32 for IPv4, 128 for IPv6.
        prefix: u8,
    },
    /// A host name pattern (lower case, may contain `*` and `?`).
    Host(String),
}

/// Export options granted to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportOptions {
    /// Writes allowed (`rw`); `false` means read-only (`ro`).
    pub rw: bool,
    /// Map uid 0 / gid 0 to the anonymous ids (`root_squash`).
    pub root_squash: bool,
    /// Map every user to the anonymous ids (`all_squash`).
    pub all_squash: bool,
    /// Anonymous user id (`anonuid=N`).
    pub anonuid: u32,
    /// Anonymous group id (`anongid=N`).
    pub anongid: u32,
    /// Require a privileged source port, below 1024 (`secure`).
    pub secure: bool,
    /// Synchronous writes requested (`sync`); `false` for `async`.
    pub sync: bool,
    /// File system id (`fsid=N`), when given.
    pub fsid: Option<u32>,
    /// Null export: reads return zeros and writes are discarded (`null`).
    pub null: bool,
    /// No NFSv3 locking (`nolock`): the lock manager answers
    /// NLM4_DENIED_NOLOCKS at once; `lock` (the default) serves it.
    pub nolock: bool,
}

impl Default for ExportOptions {
    /// `ro,root_squash,no_all_squash,anonuid=65534,anongid=65534,secure,sync`.
    fn default() -> Self {
        ExportOptions {
            rw: false,
            root_squash: true,
            all_squash: false,
            anonuid: DEFAULT_ANON_ID,
            anongid: DEFAULT_ANON_ID,
            secure: true,
            sync: true,
            fsid: None,
            null: false,
            nolock: false,
        }
    }
}

/// An error found while parsing an exports file.
///
/// Lines and columns are 1-based; columns count characters on the physical
/// line (a tab counts as one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExportsError {
    /// A double quote in the path is never closed.
    #[error("line {line}, column {column}: unterminated double quote")]
    UnterminatedQuote {
        /// Line of the opening quote.
        line: usize,
        /// Column of the opening quote.
        column: usize,
    },
    /// An option list is never closed by `)`.
    #[error("line {line}, column {column}: option list is missing its closing `)`")]
    UnterminatedParen {
        /// Line of the opening parenthesis.
        line: usize,
        /// Column of the opening parenthesis.
        column: usize,
    },
    /// A character that cannot appear at this place.
    #[error("line {line}, column {column}: unexpected character {ch:?}")]
    UnexpectedChar {
        /// Line of the character.
        line: usize,
        /// Column of the character.
        column: usize,
        /// The offending character.
        ch: char,
    },
    /// A backslash in the path not followed by three octal digits naming an
    /// ASCII character.
    #[error(
        "line {line}, column {column}: invalid escape sequence \
         (expected a backslash and three octal digits of an ASCII character)"
    )]
    InvalidEscape {
        /// Line of the backslash.
        line: usize,
        /// Column of the backslash.
        column: usize,
    },
    /// The export path does not start with `/`.
    #[error("line {line}: export path {path:?} is not absolute")]
    RelativePath {
        /// Line of the path.
        line: usize,
        /// The path as written (after unquoting).
        path: String,
    },
    /// The export path is unusable for another reason.
    #[error("line {line}: invalid export path {path:?}: {reason}")]
    InvalidPath {
        /// Line of the path.
        line: usize,
        /// The path as written (after unquoting).
        path: String,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// The same (normalized) path is exported twice.
    #[error("line {line}: {path:?} is exported again (first exported on line {first_line})")]
    DuplicatePath {
        /// Line of the second export.
        line: usize,
        /// The normalized path.
        path: String,
        /// Line of the first export.
        first_line: usize,
    },
    /// A client specification that is not understood.
    #[error("line {line}, column {column}: invalid client {client:?}: {reason}")]
    InvalidClient {
        /// Line of the client.
        line: usize,
        /// Column where the client starts.
        column: usize,
        /// The client as written.
        client: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A network prefix length out of range (e.g. `/33` for IPv4).
    #[error(
        "line {line}, column {column}: invalid prefix length {prefix:?} in {client:?} \
         (must be between 0 and {max})"
    )]
    InvalidPrefix {
        /// Line of the client.
        line: usize,
        /// Column where the client starts.
        column: usize,
        /// The client as written.
        client: String,
        /// The prefix as written.
        prefix: String,
        /// Largest prefix for this address family.
        max: u8,
    },
    /// An option that is not recognized.
    #[error("line {line}, column {column}: unknown export option {option:?}")]
    UnknownOption {
        /// Line of the option.
        line: usize,
        /// Column where the option starts.
        column: usize,
        /// The option as written.
        option: String,
    },
    /// A known option with a missing, unexpected or malformed value.
    #[error("line {line}, column {column}: option {option:?}: {reason}")]
    InvalidOptionValue {
        /// Line of the option.
        line: usize,
        /// Column where the option starts.
        column: usize,
        /// The option as written.
        option: String,
        /// What is wrong with the value.
        reason: String,
    },
}

impl ExportsError {
    /// The 1-based line the error refers to.
    pub fn line(&self) -> usize {
        match self {
            ExportsError::UnterminatedQuote { line, .. }
            | ExportsError::UnterminatedParen { line, .. }
            | ExportsError::UnexpectedChar { line, .. }
            | ExportsError::InvalidEscape { line, .. }
            | ExportsError::RelativePath { line, .. }
            | ExportsError::InvalidPath { line, .. }
            | ExportsError::DuplicatePath { line, .. }
            | ExportsError::InvalidClient { line, .. }
            | ExportsError::InvalidPrefix { line, .. }
            | ExportsError::UnknownOption { line, .. }
            | ExportsError::InvalidOptionValue { line, .. } => *line,
        }
    }
}

impl Exports {
    /// Parses the text of an exports file (see the module documentation for
    /// the format).
    pub fn parse(text: &str) -> Result<Exports, ExportsError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut entries = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for logical in logical_lines(text) {
            let Some((path, line, clients)) = parse_line(&logical)? else {
                continue;
            };
            if let Some(&first_line) = seen.get(&path) {
                return Err(ExportsError::DuplicatePath {
                    line,
                    path,
                    first_line,
                });
            }
            seen.insert(path.clone(), line);
            entries.push(ExportEntry { path, clients });
        }
        Ok(Exports { entries })
    }

    /// Builds the quick-start form used by `--export PATH` on the command
    /// line: `path` (taken literally, not quoted or escaped) exported to any
    /// client with `options`. The command line is expected to pass
    /// [`ExportOptions::permissive`] (rw, no_root_squash, insecure).
    ///
    /// Errors report line 1.
    pub fn single(path: &str, options: ExportOptions) -> Result<Exports, ExportsError> {
        let path = normalize_path(path).map_err(|e| e.at(1, path))?;
        Ok(Exports {
            entries: vec![ExportEntry {
                path,
                clients: vec![ClientRule {
                    matcher: ClientMatch::Any,
                    options,
                }],
            }],
        })
    }

    /// The export of exactly `path`. The query is normalized first (so
    /// `/srv//data/` finds `/srv/data`); subdirectories of an export are not
    /// matched. Returns `None` for relative or otherwise invalid paths.
    pub fn find(&self, path: &str) -> Option<&ExportEntry> {
        let path = normalize_path(path).ok()?;
        self.entries.iter().find(|e| e.path == path)
    }
}

impl FromStr for Exports {
    type Err = ExportsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Exports::parse(s)
    }
}

impl ExportEntry {
    /// Options for a peer at `addr` whose resolved host name is `hostname`
    /// (`None` when unknown), or `None` when the peer is not allowed.
    ///
    /// Rules are tried in file order and the first match wins. The `secure`
    /// flag is not checked here; see [`ExportOptions::port_allowed`].
    pub fn options_for(&self, addr: IpAddr, hostname: Option<&str>) -> Option<&ExportOptions> {
        self.clients
            .iter()
            .find(|rule| rule.matcher.matches(addr, hostname))
            .map(|rule| &rule.options)
    }
}

impl ClientMatch {
    /// Builds a network matcher, clearing host bits and turning IPv4-mapped
    /// IPv6 networks (prefix 96 or more) into IPv4 ones. Returns `None` when
    /// `prefix` is too long for the address family.
    pub fn net(addr: IpAddr, prefix: u8) -> Option<ClientMatch> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return None;
        }
        let (addr, prefix) = canonical_net(addr, prefix);
        Some(ClientMatch::Net { addr, prefix })
    }

    /// Whether a peer at `addr` named `hostname` matches. IPv4-mapped IPv6
    /// peer addresses are compared as IPv4; host name patterns never match
    /// when `hostname` is `None`.
    pub fn matches(&self, addr: IpAddr, hostname: Option<&str>) -> bool {
        let addr = addr.to_canonical();
        match self {
            ClientMatch::Any => true,
            ClientMatch::Addr(a) => a.to_canonical() == addr,
            ClientMatch::Net { addr: net, prefix } => match (canonical_net(*net, *prefix), addr) {
                ((IpAddr::V4(n), p), IpAddr::V4(a)) => mask_v4(a, p) == n,
                ((IpAddr::V6(n), p), IpAddr::V6(a)) => mask_v6(a, p) == n,
                _ => false,
            },
            ClientMatch::Host(pattern) => hostname.is_some_and(|h| host_matches(pattern, h)),
        }
    }
}

impl ExportOptions {
    /// Options for the command-line quick start: `rw`, `no_root_squash`,
    /// `insecure`, everything else default.
    pub fn permissive() -> ExportOptions {
        ExportOptions {
            rw: true,
            root_squash: false,
            secure: false,
            ..ExportOptions::default()
        }
    }

    /// Whether a peer connecting from source `port` is acceptable: always
    /// when `insecure`, otherwise only from a privileged port (below 1024).
    pub fn port_allowed(&self, port: u16) -> bool {
        !self.secure || port < 1024
    }

    /// The credential the server acts as for a request made as `uid`, `gid`
    /// with supplementary groups `gids`; returns `(uid, gid, groups)`.
    ///
    /// * `all_squash`: everyone becomes `anonuid`/`anongid` with no groups.
    /// * `root_squash`: uid 0 becomes `anonuid`, gid 0 becomes `anongid`, and
    ///   group 0 in the list is replaced by `anongid`; other ids are kept.
    /// * otherwise the credential is used unchanged.
    pub fn squash(&self, uid: u32, gid: u32, gids: &[u32]) -> (u32, u32, Vec<u32>) {
        if self.all_squash {
            return (self.anonuid, self.anongid, Vec::new());
        }
        if self.root_squash {
            let uid = if uid == 0 { self.anonuid } else { uid };
            let gid = if gid == 0 { self.anongid } else { gid };
            let gids = gids
                .iter()
                .map(|&g| if g == 0 { self.anongid } else { g })
                .collect();
            return (uid, gid, gids);
        }
        (uid, gid, gids.to_vec())
    }

    /// Applies one option `name[=value]`.
    fn apply(&mut self, name: &str, value: Option<&str>) -> Result<(), OptionProblem> {
        let flag = |target: &mut bool, v: bool| -> Result<(), OptionProblem> {
            match value {
                None => {
                    *target = v;
                    Ok(())
                }
                Some(_) => Err(OptionProblem::Value("this option takes no value".into())),
            }
        };
        match name {
            "rw" => flag(&mut self.rw, true),
            "ro" => flag(&mut self.rw, false),
            "root_squash" => flag(&mut self.root_squash, true),
            "no_root_squash" => flag(&mut self.root_squash, false),
            "all_squash" => flag(&mut self.all_squash, true),
            "no_all_squash" => flag(&mut self.all_squash, false),
            "secure" => flag(&mut self.secure, true),
            "insecure" => flag(&mut self.secure, false),
            "sync" => flag(&mut self.sync, true),
            "async" => flag(&mut self.sync, false),
            "null" => flag(&mut self.null, true),
            "nolock" => flag(&mut self.nolock, true),
            "lock" => flag(&mut self.nolock, false),
            "subtree_check" | "no_subtree_check" => {
                let mut ignored = false;
                flag(&mut ignored, true)
            }
            "anonuid" => {
                self.anonuid = numeric_value(value)?;
                Ok(())
            }
            "anongid" => {
                self.anongid = numeric_value(value)?;
                Ok(())
            }
            "fsid" => {
                self.fsid = Some(if value == Some("root") {
                    0
                } else {
                    numeric_value(value)?
                });
                Ok(())
            }
            _ => Err(OptionProblem::Unknown),
        }
    }
}

/// Why one option was rejected (before position information is attached).
enum OptionProblem {
    Unknown,
    Value(String),
}

/// Parses the decimal value of an `N`-valued option.
fn numeric_value(value: Option<&str>) -> Result<u32, OptionProblem> {
    let Some(v) = value else {
        return Err(OptionProblem::Value("a numeric value is required".into()));
    };
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(OptionProblem::Value(format!(
            "value {v:?} is not a decimal number"
        )));
    }
    v.parse::<u32>()
        .map_err(|_| OptionProblem::Value(format!("value {v} does not fit in 32 bits")))
}

impl fmt::Display for ExportOptions {
    /// Writes a comma-separated option list (without parentheses) that parses
    /// back to the same options.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.rw { "rw" } else { "ro" })?;
        f.write_str(if self.root_squash {
            ",root_squash"
        } else {
            ",no_root_squash"
        })?;
        if self.all_squash {
            f.write_str(",all_squash")?;
        }
        if self.anonuid != DEFAULT_ANON_ID {
            write!(f, ",anonuid={}", self.anonuid)?;
        }
        if self.anongid != DEFAULT_ANON_ID {
            write!(f, ",anongid={}", self.anongid)?;
        }
        f.write_str(if self.secure { ",secure" } else { ",insecure" })?;
        f.write_str(if self.sync { ",sync" } else { ",async" })?;
        if let Some(fsid) = self.fsid {
            write!(f, ",fsid={fsid}")?;
        }
        if self.null {
            f.write_str(",null")?;
        }
        if self.nolock {
            f.write_str(",nolock")?;
        }
        Ok(())
    }
}

impl fmt::Display for ClientMatch {
    /// Writes the client as it appears in an exports file.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientMatch::Any => f.write_str("*"),
            ClientMatch::Addr(a) => write!(f, "{a}"),
            ClientMatch::Net { addr, prefix } => write!(f, "{addr}/{prefix}"),
            ClientMatch::Host(pattern) => f.write_str(pattern),
        }
    }
}

impl fmt::Display for ClientRule {
    /// Writes `CLIENT(OPTIONS)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.matcher, self.options)
    }
}

impl fmt::Display for ExportEntry {
    /// Writes one exports line (without the line break), quoting and escaping
    /// the path as needed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&quote_path(&self.path))?;
        for rule in &self.clients {
            write!(f, " {rule}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Exports {
    /// Writes one line per export; [`Exports::parse`] reads the text back to
    /// an equal value (for anything `parse` produced).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for entry in &self.entries {
            writeln!(f, "{entry}")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Lexing
// ---------------------------------------------------------------------------

/// A character of a logical line with its physical position.
#[derive(Clone, Copy, Debug)]
struct Ch {
    c: char,
    line: usize,
    column: usize,
}

/// Splits `text` into logical lines, joining backslash-continued lines.
fn logical_lines(text: &str) -> Vec<Vec<Ch>> {
    let mut out = Vec::new();
    let mut current: Vec<Ch> = Vec::new();
    let mut continued = false;
    for (index, raw) in text.split('\n').enumerate() {
        let line = index + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let (body, continues) = match raw.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (raw, false),
        };
        let mut column = 0;
        for c in body.chars() {
            column += 1;
            current.push(Ch { c, line, column });
        }
        if continues {
            current.push(Ch {
                c: ' ',
                line,
                column: column + 1,
            });
        } else {
            out.push(std::mem::take(&mut current));
        }
        continued = continues;
    }
    if continued && !current.is_empty() {
        out.push(current);
    }
    out
}

/// Token separators.
fn is_sep(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\x0b' | '\x0c')
}

fn skip_seps(chars: &[Ch], mut i: usize) -> usize {
    while chars.get(i).is_some_and(|ch| is_sep(ch.c)) {
        i += 1;
    }
    i
}

fn unexpected(ch: Ch) -> ExportsError {
    ExportsError::UnexpectedChar {
        line: ch.line,
        column: ch.column,
        ch: ch.c,
    }
}

/// Parses one logical line; `None` for blank and comment lines.
fn parse_line(chars: &[Ch]) -> Result<Option<(String, usize, Vec<ClientRule>)>, ExportsError> {
    let mut i = skip_seps(chars, 0);
    let Some(&first) = chars.get(i) else {
        return Ok(None);
    };
    if first.c == '#' {
        return Ok(None);
    }
    let (raw_path, next) = read_path(chars, i)?;
    i = next;
    let path = normalize_path(&raw_path).map_err(|e| e.at(first.line, &raw_path))?;

    let mut clients = Vec::new();
    loop {
        i = skip_seps(chars, i);
        let Some(&start) = chars.get(i) else { break };
        if start.c == '#' {
            break;
        }
        let mut name = String::new();
        while let Some(&ch) = chars.get(i) {
            match ch.c {
                c if is_sep(c) => break,
                '(' | '#' => break,
                ')' | '"' | '\\' => return Err(unexpected(ch)),
                c => name.push(c),
            }
            i += 1;
        }
        let mut options = ExportOptions::default();
        if let Some(&open) = chars.get(i).filter(|ch| ch.c == '(') {
            let (items, next) = read_option_list(chars, i + 1, open)?;
            i = next;
            if let Some(&after) = chars.get(i) {
                if !is_sep(after.c) && after.c != '#' {
                    return Err(unexpected(after));
                }
            }
            for (text, pos) in items {
                let (opt, value) = match text.split_once('=') {
                    Some((n, v)) => (n, Some(v)),
                    None => (text.as_str(), None),
                };
                options.apply(opt, value).map_err(|p| match p {
                    OptionProblem::Unknown => ExportsError::UnknownOption {
                        line: pos.line,
                        column: pos.column,
                        option: text.clone(),
                    },
                    OptionProblem::Value(reason) => ExportsError::InvalidOptionValue {
                        line: pos.line,
                        column: pos.column,
                        option: text.clone(),
                        reason,
                    },
                })?;
            }
        }
        let matcher = parse_client(&name, start)?;
        clients.push(ClientRule { matcher, options });
    }
    if clients.is_empty() {
        clients.push(ClientRule {
            matcher: ClientMatch::Any,
            options: ExportOptions::default(),
        });
    }
    Ok(Some((path, first.line, clients)))
}

/// Reads the path token starting at `i`, handling quotes and `\ooo` escapes.
/// Returns the unquoted text and the index after the token.
fn read_path(chars: &[Ch], mut i: usize) -> Result<(String, usize), ExportsError> {
    let mut out = String::new();
    let mut open_quote: Option<Ch> = None;
    while let Some(&ch) = chars.get(i) {
        match ch.c {
            '"' => {
                open_quote = match open_quote {
                    Some(_) => None,
                    None => Some(ch),
                };
                i += 1;
            }
            '\\' => {
                let mut value: u32 = 0;
                for k in 1..=3 {
                    let digit = chars.get(i + k).and_then(|d| d.c.to_digit(8)).ok_or(
                        ExportsError::InvalidEscape {
                            line: ch.line,
                            column: ch.column,
                        },
                    )?;
                    value = value * 8 + digit;
                }
                let decoded = u8::try_from(value)
                    .ok()
                    .filter(u8::is_ascii)
                    .map(char::from)
                    .ok_or(ExportsError::InvalidEscape {
                        line: ch.line,
                        column: ch.column,
                    })?;
                out.push(decoded);
                i += 4;
            }
            c if open_quote.is_none() && (is_sep(c) || c == '#') => break,
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    if let Some(q) = open_quote {
        return Err(ExportsError::UnterminatedQuote {
            line: q.line,
            column: q.column,
        });
    }
    Ok((out, i))
}

/// Reads an option list after its `(` (at `open`), up to and including `)`.
/// Returns the non-empty comma-separated items with their start positions and
/// the index after `)`.
fn read_option_list(
    chars: &[Ch],
    mut i: usize,
    open: Ch,
) -> Result<(Vec<(String, Ch)>, usize), ExportsError> {
    let mut items = Vec::new();
    let mut current = String::new();
    let mut current_start: Option<Ch> = None;
    // Whitespace seen after the current item started: only `,` or `)` may follow.
    let mut gap: Option<Ch> = None;
    loop {
        let Some(&ch) = chars.get(i) else {
            return Err(ExportsError::UnterminatedParen {
                line: open.line,
                column: open.column,
            });
        };
        i += 1;
        match ch.c {
            ')' | ',' => {
                if let Some(start) = current_start.take() {
                    items.push((std::mem::take(&mut current), start));
                }
                gap = None;
                if ch.c == ')' {
                    return Ok((items, i));
                }
            }
            c if is_sep(c) => {
                if current_start.is_some() && gap.is_none() {
                    gap = Some(ch);
                }
            }
            '(' | '"' | '#' | '\\' => return Err(unexpected(ch)),
            c => {
                if let Some(space) = gap {
                    return Err(unexpected(space));
                }
                current_start.get_or_insert(ch);
                current.push(c);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------

/// Why a path was rejected (before position information is attached).
enum PathProblem {
    Relative,
    Invalid(&'static str),
}

impl PathProblem {
    fn at(self, line: usize, path: &str) -> ExportsError {
        let path = path.to_string();
        match self {
            PathProblem::Relative => ExportsError::RelativePath { line, path },
            PathProblem::Invalid(reason) => ExportsError::InvalidPath { line, path, reason },
        }
    }
}

/// Normalizes an absolute path: collapses `//`, drops `.` components and the
/// trailing `/`; rejects `..` components and NUL characters.
fn normalize_path(path: &str) -> Result<String, PathProblem> {
    if path.is_empty() {
        return Err(PathProblem::Invalid("the path is empty"));
    }
    if !path.starts_with('/') {
        return Err(PathProblem::Relative);
    }
    if path.contains('\0') {
        return Err(PathProblem::Invalid("the path contains a NUL character"));
    }
    let mut out = String::with_capacity(path.len());
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => return Err(PathProblem::Invalid("`..` components are not allowed")),
            c => {
                out.push('/');
                out.push_str(c);
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// Writes a path so that the lexer reads it back unchanged.
fn quote_path(path: &str) -> String {
    let mut body = String::with_capacity(path.len() + 2);
    let mut needs_quotes = false;
    for c in path.chars() {
        match c {
            '\\' | '"' => {
                let _ = write!(body, "\\{:03o}", u32::from(c));
            }
            c if c.is_ascii_control() => {
                let _ = write!(body, "\\{:03o}", u32::from(c));
            }
            ' ' | '#' => {
                needs_quotes = true;
                body.push(c);
            }
            c => body.push(c),
        }
    }
    if needs_quotes {
        format!("\"{body}\"")
    } else {
        body
    }
}

// ---------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------

/// Parses a client name (the part before `(`) that starts at `start`.
fn parse_client(name: &str, start: Ch) -> Result<ClientMatch, ExportsError> {
    let invalid = |reason: String| ExportsError::InvalidClient {
        line: start.line,
        column: start.column,
        client: name.to_string(),
        reason,
    };
    if name.is_empty() || name == "*" {
        return Ok(ClientMatch::Any);
    }
    if let Some((addr_text, mask)) = name.split_once('/') {
        let addr: IpAddr = addr_text
            .parse()
            .map_err(|_| invalid(format!("{addr_text:?} is not an IP address")))?;
        let max: u8 = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if !mask.is_empty() && mask.bytes().all(|b| b.is_ascii_digit()) {
            match mask.parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => {
                    return Err(ExportsError::InvalidPrefix {
                        line: start.line,
                        column: start.column,
                        client: name.to_string(),
                        prefix: mask.to_string(),
                        max,
                    })
                }
            }
        } else if let (true, Ok(dotted)) = (addr.is_ipv4(), mask.parse::<Ipv4Addr>()) {
            let bits = u32::from(dotted);
            let ones = bits.leading_ones();
            if ones + bits.trailing_zeros() != 32 {
                return Err(invalid(format!("netmask {mask} is not contiguous")));
            }
            // `ones` is at most 32.
            u8::try_from(ones).unwrap_or(32)
        } else {
            return Err(invalid(format!(
                "{mask:?} is neither a prefix length nor a dotted IPv4 netmask"
            )));
        };
        let (addr, prefix) = canonical_net(addr, prefix);
        return Ok(ClientMatch::Net { addr, prefix });
    }
    if let Ok(addr) = name.parse::<IpAddr>() {
        return Ok(ClientMatch::Addr(addr.to_canonical()));
    }
    if name.starts_with('@') {
        return Err(invalid("netgroups are not supported".into()));
    }
    if name.contains(':') {
        return Err(invalid("not a valid IPv6 address".into()));
    }
    if let Some(bad) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '*' | '?')))
    {
        return Err(invalid(format!(
            "character {bad:?} is not allowed in a host name pattern"
        )));
    }
    Ok(ClientMatch::Host(name.to_ascii_lowercase()))
}

/// Clears host bits; IPv4-mapped IPv6 networks with a prefix of at least 96
/// become IPv4 networks. Prefixes longer than the family allows are clamped.
fn canonical_net(addr: IpAddr, prefix: u8) -> (IpAddr, u8) {
    match addr {
        IpAddr::V4(a) => {
            let prefix = prefix.min(32);
            (IpAddr::V4(mask_v4(a, prefix)), prefix)
        }
        IpAddr::V6(a) => {
            let prefix = prefix.min(128);
            if prefix >= 96 {
                if let Some(v4) = a.to_ipv4_mapped() {
                    let prefix = prefix - 96;
                    return (IpAddr::V4(mask_v4(v4, prefix)), prefix);
                }
            }
            (IpAddr::V6(mask_v6(a, prefix)), prefix)
        }
    }
}

fn mask_v4(a: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    let keep = 32 - u32::from(prefix.min(32));
    let mask = u32::MAX.checked_shl(keep).unwrap_or(0);
    Ipv4Addr::from(u32::from(a) & mask)
}

fn mask_v6(a: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let keep = 128 - u32::from(prefix.min(128));
    let mask = u128::MAX.checked_shl(keep).unwrap_or(0);
    Ipv6Addr::from(u128::from(a) & mask)
}

/// Case-insensitive wildcard match of a host name (a trailing dot is ignored).
fn host_matches(pattern: &str, hostname: &str) -> bool {
    let hostname = hostname.strip_suffix('.').unwrap_or(hostname);
    let pattern: Vec<char> = pattern.chars().map(|c| c.to_ascii_lowercase()).collect();
    let name: Vec<char> = hostname.chars().map(|c| c.to_ascii_lowercase()).collect();
    wildcard_match(&pattern, &name)
}

/// Matches `name` against `pattern`, where `*` matches any run of characters
/// and `?` exactly one. Iterative, with single-star backtracking (linear
/// memory, quadratic time at worst).
fn wildcard_match(pattern: &[char], name: &[char]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == '?' || Some(&c) == name.get(n) => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pattern
        .get(p..)
        .is_some_and(|rest| rest.iter().all(|&c| c == '*'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn one(text: &str) -> ExportEntry {
        let e = Exports::parse(text).unwrap();
        assert_eq!(e.entries.len(), 1, "{text:?}");
        e.entries.into_iter().next().unwrap()
    }

    fn opts(list: &str) -> ExportOptions {
        one(&format!("/x *({list})")).clients[0].options.clone()
    }

    fn err(text: &str) -> ExportsError {
        Exports::parse(text).unwrap_err()
    }

    #[test]
    fn defaults() {
        let d = ExportOptions::default();
        assert!(!d.rw);
        assert!(d.root_squash);
        assert!(!d.all_squash);
        assert_eq!(d.anonuid, 65534);
        assert_eq!(d.anongid, 65534);
        assert!(d.secure);
        assert!(d.sync);
        assert_eq!(d.fsid, None);
        assert!(!d.null);
        assert_eq!(opts(""), d);
        let e = one("/srv host1");
        assert_eq!(e.clients[0].options, d);
        assert_eq!(e.clients[0].matcher, ClientMatch::Host("host1".into()));
    }

    #[test]
    fn path_without_clients_is_exported_to_anyone_with_defaults() {
        let e = one("/srv");
        assert_eq!(
            e.clients,
            vec![ClientRule {
                matcher: ClientMatch::Any,
                options: ExportOptions::default()
            }]
        );
    }

    #[test]
    fn each_option() {
        assert!(opts("rw").rw);
        assert!(!opts("rw,ro").rw);
        assert!(opts("ro,rw").rw);
        assert!(!opts("no_root_squash").root_squash);
        assert!(opts("no_root_squash,root_squash").root_squash);
        assert!(opts("all_squash").all_squash);
        assert!(!opts("all_squash,no_all_squash").all_squash);
        assert_eq!(opts("anonuid=1000").anonuid, 1000);
        assert_eq!(opts("anongid=0").anongid, 0);
        assert_eq!(opts("anonuid=4294967295").anonuid, u32::MAX);
        assert!(!opts("insecure").secure);
        assert!(opts("insecure,secure").secure);
        assert!(!opts("async").sync);
        assert!(opts("async,sync").sync);
        assert_eq!(opts("fsid=7").fsid, Some(7));
        assert_eq!(opts("fsid=root").fsid, Some(0));
        assert!(opts("null").null);
        assert!(opts("nolock").nolock);
        assert!(!opts("nolock,lock").nolock);
        assert_eq!(opts("no_subtree_check"), ExportOptions::default());
        assert_eq!(opts("subtree_check"), ExportOptions::default());
        let all =
            opts("rw,no_root_squash,all_squash,anonuid=1,anongid=2,insecure,async,fsid=3,null");
        assert_eq!(
            all,
            ExportOptions {
                rw: true,
                root_squash: false,
                all_squash: true,
                anonuid: 1,
                anongid: 2,
                secure: false,
                sync: false,
                fsid: Some(3),
                null: true,
                nolock: false,
            }
        );
    }

    #[test]
    fn option_list_tolerates_spaces_around_items_and_empty_items() {
        assert_eq!(opts(" rw , async ,, "), opts("rw,async"));
        let e = one("/x host(rw,\\\n  async)");
        assert_eq!(e.clients[0].options, opts("rw,async"));
    }

    #[test]
    fn option_errors() {
        assert_eq!(
            err("/x *(rw,bogus)"),
            ExportsError::UnknownOption {
                line: 1,
                column: 9,
                option: "bogus".into()
            }
        );
        assert_eq!(
            err("# c\n\n/a\n/x\t a(ro) b(ro,Rw)"),
            ExportsError::UnknownOption {
                line: 4,
                column: 16,
                option: "Rw".into()
            }
        );
        let msg = err("/x *(rw,bogus)").to_string();
        assert!(msg.contains("line 1") && msg.contains("column 9") && msg.contains("bogus"));
        for bad in [
            "anonuid",
            "anonuid=",
            "anonuid=-1",
            "anonuid=+1",
            "anonuid=x",
            "anonuid=4294967296",
            "anongid=1e3",
            "fsid=",
            "fsid=abc",
            "rw=1",
            "null=yes",
            "no_subtree_check=1",
        ] {
            match err(&format!("/x *({bad})")) {
                ExportsError::InvalidOptionValue {
                    line: 1,
                    column: 6,
                    option,
                    ..
                } => assert_eq!(option, bad),
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(matches!(
            err("/x *(rw sync)"),
            ExportsError::UnexpectedChar {
                line: 1,
                column: 8,
                ch: ' '
            }
        ));
    }

    #[test]
    fn client_forms() {
        let e = one(
            "/x * 10.1.2.3 fe80::1 10.0.0.0/8 192.168.1.77/255.255.255.0 ::1/128 \
             2001:db8::/32 *.Example.COM host? (rw) ::ffff:10.9.8.7 ::ffff:10.0.0.0/104",
        );
        let m: Vec<ClientMatch> = e.clients.iter().map(|c| c.matcher.clone()).collect();
        assert_eq!(
            m,
            vec![
                ClientMatch::Any,
                ClientMatch::Addr(v4("10.1.2.3")),
                ClientMatch::Addr(v4("fe80::1")),
                ClientMatch::Net {
                    addr: v4("10.0.0.0"),
                    prefix: 8
                },
                ClientMatch::Net {
                    addr: v4("192.168.1.0"),
                    prefix: 24
                },
                ClientMatch::Net {
                    addr: v4("::1"),
                    prefix: 128
                },
                ClientMatch::Net {
                    addr: v4("2001:db8::"),
                    prefix: 32
                },
                ClientMatch::Host("*.example.com".into()),
                ClientMatch::Host("host?".into()),
                ClientMatch::Any,
                ClientMatch::Addr(v4("10.9.8.7")),
                ClientMatch::Net {
                    addr: v4("10.0.0.0"),
                    prefix: 8
                },
            ]
        );
        assert!(e.clients[9].options.rw);
        assert!(!e.clients[8].options.rw);
        assert_eq!(
            one("/x 0.0.0.0/0.0.0.0").clients[0].matcher,
            ClientMatch::Net {
                addr: v4("0.0.0.0"),
                prefix: 0
            }
        );
        assert_eq!(
            one("/x 10.1.2.3/32").clients[0].matcher,
            ClientMatch::Net {
                addr: v4("10.1.2.3"),
                prefix: 32
            }
        );
    }

    #[test]
    fn client_errors() {
        assert_eq!(
            err("/x a(rw)\n/y  10.0.0.0/33(rw)"),
            ExportsError::InvalidPrefix {
                line: 2,
                column: 5,
                client: "10.0.0.0/33".into(),
                prefix: "33".into(),
                max: 32
            }
        );
        assert!(matches!(
            err("/x ::/129"),
            ExportsError::InvalidPrefix { max: 128, .. }
        ));
        assert!(matches!(
            err("/x 10.0.0.0/999999999999999999999"),
            ExportsError::InvalidPrefix { .. }
        ));
        for bad in [
            "10.0.0.0/",
            "10.0.0.0/abc",
            "10.0.0.0/+8",
            "10.0.0.0/255.0.255.0",
            "::/255.0.0.0",
            "host/24",
            "10.0.0/8",
            "@group",
            "fe80::1%eth0",
            "1:2",
            "ho$t",
            "a,b",
            "h\u{e9}",
        ] {
            match err(&format!("/x {bad}(rw)")) {
                ExportsError::InvalidClient {
                    line: 1,
                    column: 4,
                    client,
                    ..
                } => assert_eq!(client, bad),
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(matches!(
            err("/x host)"),
            ExportsError::UnexpectedChar { ch: ')', .. }
        ));
        assert!(matches!(
            err("/x host(rw)x"),
            ExportsError::UnexpectedChar {
                column: 12,
                ch: 'x',
                ..
            }
        ));
        assert!(matches!(
            err("/x host(rw)(ro)"),
            ExportsError::UnexpectedChar { ch: '(', .. }
        ));
    }

    #[test]
    fn syntax_errors() {
        assert_eq!(
            err("/a\n\"/x y host(rw)"),
            ExportsError::UnterminatedQuote { line: 2, column: 1 }
        );
        assert_eq!(
            err("/a *\n/b\n/x  host(rw,sync"),
            ExportsError::UnterminatedParen { line: 3, column: 9 }
        );
        assert_eq!(
            err("/x host(rw # comment)"),
            ExportsError::UnexpectedChar {
                line: 1,
                column: 12,
                ch: '#'
            }
        );
        assert_eq!(
            err("/x\\12"),
            ExportsError::InvalidEscape { line: 1, column: 3 }
        );
        assert_eq!(
            err("/x\\200"),
            ExportsError::InvalidEscape { line: 1, column: 3 }
        );
        assert_eq!(
            err("/x\\08a"),
            ExportsError::InvalidEscape { line: 1, column: 3 }
        );
    }

    #[test]
    fn path_errors() {
        assert_eq!(
            err("/ok\nrelative/path *"),
            ExportsError::RelativePath {
                line: 2,
                path: "relative/path".into()
            }
        );
        assert!(matches!(
            err("(rw)"),
            ExportsError::RelativePath { line: 1, .. }
        ));
        assert!(matches!(
            err("/a/../b"),
            ExportsError::InvalidPath { line: 1, .. }
        ));
        assert!(matches!(
            err("/a/..\n"),
            ExportsError::InvalidPath { line: 1, .. }
        ));
        assert!(matches!(err("\"\""), ExportsError::InvalidPath { .. }));
        assert!(matches!(err("/a\\000"), ExportsError::InvalidPath { .. }));
        assert_eq!(
            err("/srv/a *\n# x\n/srv//a/ host"),
            ExportsError::DuplicatePath {
                line: 3,
                path: "/srv/a".into(),
                first_line: 1
            }
        );
        let msg = err("/srv/a\n/srv/a").to_string();
        assert!(msg.contains("line 2") && msg.contains("line 1") && msg.contains("/srv/a"));
        assert_eq!(err("/srv/a\n/srv/a").line(), 2);
    }

    #[test]
    fn paths_are_normalized() {
        assert_eq!(one("/").path, "/");
        assert_eq!(one("//").path, "/");
        assert_eq!(one("/./.").path, "/");
        assert_eq!(one("/srv//data/").path, "/srv/data");
        assert_eq!(one("/srv/./data/.").path, "/srv/data");
        assert_eq!(one("/a..b/...").path, "/a..b/...");
        assert_eq!(one("\"/srv/with space\" host").path, "/srv/with space");
        assert_eq!(one("/srv/\"a b\"/c\\040d").path, "/srv/a b/c d");
        assert_eq!(one("\"/a#b\" # comment").path, "/a#b");
        assert_eq!(one("/a#b").path, "/a");
        assert_eq!(one("/a\\042\\134b").path, "/a\"\\b");
    }

    #[test]
    fn comments_blank_lines_and_continuations() {
        let text = "\u{feff}# header\n\n   \t\n/a  host1(rw) # trailing\r\n/b \\\n  host2(ro) \\\n  host3\n\
                    # /c\n/d\\\n";
        let e = Exports::parse(text).unwrap();
        let paths: Vec<&str> = e.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/a", "/b", "/d"]);
        assert_eq!(e.entries[1].clients.len(), 2);
        assert_eq!(
            e.entries[1].clients[1].matcher,
            ClientMatch::Host("host3".into())
        );
        // Errors on continued lines point at the physical line.
        assert_eq!(
            err("/x \\\n host(rw,\\\n   nope)"),
            ExportsError::UnknownOption {
                line: 3,
                column: 4,
                option: "nope".into()
            }
        );
        assert!(Exports::parse("").unwrap().entries.is_empty());
        assert!(Exports::parse("\\").unwrap().entries.is_empty());
    }

    #[test]
    fn first_match_wins() {
        let e = one("/x 10.0.0.5(rw,no_root_squash) 10.0.0.0/8(ro) *(rw,all_squash)");
        let o = e.options_for(v4("10.0.0.5"), None).unwrap();
        assert!(o.rw && !o.root_squash);
        let o = e.options_for(v4("10.0.0.6"), None).unwrap();
        assert!(!o.rw && o.root_squash && !o.all_squash);
        let o = e.options_for(v4("11.0.0.1"), None).unwrap();
        assert!(o.rw && o.all_squash);

        let e = one("/x *(ro) 10.0.0.5(rw)");
        assert!(!e.options_for(v4("10.0.0.5"), None).unwrap().rw);

        let e = one("/x 10.0.0.0/8(rw) 192.168.0.0/16");
        assert!(e.options_for(v4("12.0.0.1"), None).is_none());
        assert!(e.options_for(v4("192.168.3.4"), None).is_some());
        assert!(e.options_for(v4("::1"), None).is_none());
    }

    #[test]
    fn ipv4_mapped_peers_match_ipv4_rules() {
        let e = one("/x 10.0.0.0/8(rw) 192.168.1.1(ro)");
        assert!(e.options_for(v4("::ffff:10.1.2.3"), None).unwrap().rw);
        assert!(!e.options_for(v4("::ffff:192.168.1.1"), None).unwrap().rw);
        assert!(e.options_for(v4("::ffff:192.168.1.2"), None).is_none());
        // Mapped rules match plain IPv4 peers too.
        let e = one("/x ::ffff:10.0.0.0/104(rw) ::ffff:1.2.3.4");
        assert!(e.options_for(v4("10.200.0.1"), None).is_some());
        assert!(e.options_for(v4("1.2.3.4"), None).is_some());
        assert!(e.options_for(v4("1.2.3.5"), None).is_none());
        // IPv6 rules still work for real IPv6 peers.
        let e = one("/x 2001:db8::/32(rw) ::1");
        assert!(e.options_for(v4("2001:db8:1::9"), None).is_some());
        assert!(e.options_for(v4("::1"), None).is_some());
        assert!(e.options_for(v4("2001:db9::1"), None).is_none());
        assert!(e.options_for(v4("0.0.0.1"), None).is_none());
    }

    #[test]
    fn hostname_wildcards() {
        let e = one("/x *.example.com(rw) host?(ro) exact.org");
        let ip = v4("10.0.0.1");
        assert!(e.options_for(ip, Some("a.example.com")).unwrap().rw);
        assert!(e.options_for(ip, Some("a.b.EXAMPLE.com.")).unwrap().rw);
        assert!(e.options_for(ip, Some("example.com")).is_none());
        assert!(e.options_for(ip, Some("a.example.com.evil")).is_none());
        assert!(!e.options_for(ip, Some("host1")).unwrap().rw);
        assert!(e.options_for(ip, Some("host")).is_none());
        assert!(e.options_for(ip, Some("host12")).is_none());
        assert!(e.options_for(ip, Some("Exact.Org")).is_some());
        assert!(e.options_for(ip, Some("exact.org2")).is_none());
        assert!(e.options_for(ip, None).is_none());
        assert!(e.options_for(ip, Some("")).is_none());

        assert!(wildcard_match(&['*'], &[]));
        let p: Vec<char> = "a*b*c".chars().collect();
        assert!(wildcard_match(&p, &"aXXbYYbZc".chars().collect::<Vec<_>>()));
        assert!(!wildcard_match(&p, &"aXXbYYbZ".chars().collect::<Vec<_>>()));
        // Pathological pattern stays fast.
        let long = "a".repeat(5000);
        let pat: Vec<char> = "*a".repeat(50).chars().chain(['b']).collect();
        assert!(!wildcard_match(&pat, &long.chars().collect::<Vec<_>>()));
    }

    #[test]
    fn squash_behaviour() {
        let groups = [0, 10, 0, 20];
        // root_squash (default)
        let o = opts("anonuid=99,anongid=98");
        assert_eq!(o.squash(0, 0, &groups), (99, 98, vec![98, 10, 98, 20]));
        assert_eq!(o.squash(1000, 0, &[5]), (1000, 98, vec![5]));
        assert_eq!(o.squash(1000, 100, &[10, 20]), (1000, 100, vec![10, 20]));
        assert_eq!(o.squash(0, 100, &[]), (99, 100, vec![]));
        // no_root_squash
        let o = opts("no_root_squash,anonuid=99");
        assert_eq!(o.squash(0, 0, &groups), (0, 0, groups.to_vec()));
        // all_squash wins over no_root_squash
        let o = opts("no_root_squash,all_squash,anonuid=7,anongid=8");
        assert_eq!(o.squash(0, 0, &groups), (7, 8, vec![]));
        assert_eq!(o.squash(1000, 100, &[10]), (7, 8, vec![]));
        // defaults map to 65534
        assert_eq!(
            ExportOptions::default().squash(0, 0, &[0]),
            (65534, 65534, vec![65534])
        );
    }

    #[test]
    fn secure_port_check() {
        assert!(ExportOptions::default().port_allowed(1023));
        assert!(!ExportOptions::default().port_allowed(1024));
        assert!(opts("insecure").port_allowed(40000));
    }

    #[test]
    fn single_and_find() {
        let e = Exports::single("/srv//data/", ExportOptions::permissive()).unwrap();
        assert_eq!(e.entries.len(), 1);
        let entry = e.find("/srv/data").unwrap();
        assert_eq!(entry.path, "/srv/data");
        let o = entry.options_for(v4("203.0.113.9"), None).unwrap();
        assert!(o.rw && !o.root_squash && !o.secure && o.sync);
        assert!(e.find("/srv/data/").is_some());
        assert!(e.find("/srv/./data").is_some());
        assert!(e.find("/srv").is_none());
        assert!(e.find("/srv/data/sub").is_none());
        assert!(e.find("srv/data").is_none());
        assert!(e.find("/srv/../srv/data").is_none());
        assert_eq!(
            Exports::single("data", ExportOptions::default()).unwrap_err(),
            ExportsError::RelativePath {
                line: 1,
                path: "data".into()
            }
        );
        // Spaces need no quoting on the command line.
        let e = Exports::single("/a b", ExportOptions::default()).unwrap();
        assert_eq!(Exports::parse(&e.to_string()).unwrap(), e);
    }

    #[test]
    fn display_round_trip_fixed() {
        let text = "\"/srv/a b\" 10.0.0.0/8(rw,no_root_squash,anonuid=5) *.lab(ro,fsid=3,null)\n\
                    /srv/q\\042x\\134y\\011 ::1(insecure,async) (all_squash,anongid=9)\n\
                    \"/h#sh\" host?\n/";
        let e = Exports::parse(text).unwrap();
        let shown = e.to_string();
        assert_eq!(Exports::parse(&shown).unwrap(), e);
        assert_eq!(
            e.entries[0].to_string(),
            "\"/srv/a b\" 10.0.0.0/8(rw,no_root_squash,anonuid=5,secure,sync) \
             *.lab(ro,root_squash,secure,sync,fsid=3,null)"
        );
        assert_eq!(e.entries[3].to_string(), "/ *(ro,root_squash,secure,sync)");
    }

    #[test]
    fn nasty_inputs_do_not_panic() {
        let long_line = format!("/x {}", "a(rw) ".repeat(10_000));
        let many_lines = "/a\\\n".repeat(10_000);
        let deep = "(".repeat(10_000);
        let inputs: Vec<&str> = vec![
            "",
            "\\",
            "\\\\",
            "\"",
            "\"\"\"",
            "#",
            "(",
            ")",
            "()",
            "/x (",
            "/x )",
            "/x ((",
            "/x (()",
            "/x \\",
            "/x\\",
            "/x\\7",
            "/x\\77",
            "/x\\777",
            "/x *(=)",
            "/x *(==)",
            "/x *(anonuid==1)",
            "/x */",
            "/x /",
            "/x //",
            "/x ::/",
            "/x 1.2.3.4/255.255.255.255.255",
            "/x \u{0}",
            "\u{0}",
            "/\u{10ffff}\u{202e} \u{2028}(rw)",
            "\r\r\r\n\r",
            "\n\n\n\\\n\\\n",
            "/x *(rw)\\\n",
            "/x \"a\"",
            "/x *(\"rw\")",
            "\u{feff}\u{feff}/x",
            &long_line,
            &many_lines,
            &deep,
        ];
        for input in inputs {
            if let Ok(e) = Exports::parse(input) {
                assert_eq!(Exports::parse(&e.to_string()).unwrap(), e, "{input:?}");
            }
        }
        assert_eq!(
            Exports::parse(&long_line).unwrap().entries[0].clients.len(),
            10_000
        );
    }

    // -- property tests ----------------------------------------------------

    fn arb_path() -> impl Strategy<Value = String> {
        let segment = prop_oneof![
            "[a-z0-9_.-]{1,8}",
            "[ #\"\\\\\t\n\r()*,=a\u{e9}\u{2028}\u{0}-\u{1f}]{1,6}",
        ];
        proptest::collection::vec(segment, 0..4).prop_filter_map("normalizable", |segs| {
            normalize_path(&format!("/{}", segs.join("/"))).ok()
        })
    }

    fn arb_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b))),
            any::<u128>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
            any::<u32>().prop_map(|b| IpAddr::V6(Ipv4Addr::from(b).to_ipv6_mapped())),
        ]
    }

    fn arb_matcher() -> impl Strategy<Value = ClientMatch> {
        prop_oneof![
            Just(ClientMatch::Any),
            arb_ip().prop_map(|a| ClientMatch::Addr(a.to_canonical())),
            (arb_ip(), 0u8..=128).prop_map(|(a, p)| {
                let max = if a.is_ipv4() { 32 } else { 128 };
                ClientMatch::net(a, p.min(max)).unwrap()
            }),
            "[a-z0-9*?._-]{1,12}".prop_filter_map("host pattern", |h| {
                match parse_client(
                    &h,
                    Ch {
                        c: ' ',
                        line: 1,
                        column: 1,
                    },
                ) {
                    Ok(m @ ClientMatch::Host(_)) => Some(m),
                    _ => None,
                }
            }),
        ]
    }

    fn arb_options() -> impl Strategy<Value = ExportOptions> {
        (
            any::<[bool; 7]>(),
            prop_oneof![Just(DEFAULT_ANON_ID), any::<u32>()],
            prop_oneof![Just(DEFAULT_ANON_ID), any::<u32>()],
            proptest::option::of(any::<u32>()),
        )
            .prop_map(|(b, anonuid, anongid, fsid)| ExportOptions {
                rw: b[0],
                root_squash: b[1],
                all_squash: b[2],
                anonuid,
                anongid,
                secure: b[3],
                sync: b[4],
                fsid,
                null: b[5],
                nolock: b[6],
            })
    }

    fn arb_exports() -> impl Strategy<Value = Exports> {
        let rule = (arb_matcher(), arb_options())
            .prop_map(|(matcher, options)| ClientRule { matcher, options });
        let entry = (arb_path(), proptest::collection::vec(rule, 1..4))
            .prop_map(|(path, clients)| ExportEntry { path, clients });
        proptest::collection::vec(entry, 0..5).prop_map(|entries| {
            let mut seen = std::collections::HashSet::new();
            Exports {
                entries: entries
                    .into_iter()
                    .filter(|e| seen.insert(e.path.clone()))
                    .collect(),
            }
        })
    }

    /// Text made of the characters that matter to the grammar.
    fn arb_exports_text() -> impl Strategy<Value = String> {
        let token = prop_oneof![
            Just("/".to_string()),
            Just("/srv".to_string()),
            Just("*".to_string()),
            Just("(".to_string()),
            Just(")".to_string()),
            Just("rw".to_string()),
            Just("ro,".to_string()),
            Just("anonuid=".to_string()),
            Just("fsid=root".to_string()),
            Just("10.0.0.0/".to_string()),
            Just("::ffff:".to_string()),
            Just("*.a".to_string()),
            "[ \t\n\r\\\\\"#(),=/:.*?0-9a-z]{0,6}",
            "\\PC{0,3}",
        ];
        proptest::collection::vec(token, 0..24).prop_map(|t| t.concat())
    }

    proptest! {
        #[test]
        fn prop_display_round_trip(e in arb_exports()) {
            let text = e.to_string();
            let back = Exports::parse(&text);
            prop_assert_eq!(back.as_ref(), Ok(&e), "text: {:?}", text);
        }

        #[test]
        fn prop_never_panics_on_arbitrary_strings(s in any::<String>()) {
            if let Ok(e) = Exports::parse(&s) {
                prop_assert_eq!(Exports::parse(&e.to_string()), Ok(e));
            }
        }

        #[test]
        fn prop_never_panics_on_grammar_like_text(s in arb_exports_text()) {
            match Exports::parse(&s) {
                Ok(e) => prop_assert_eq!(Exports::parse(&e.to_string()), Ok(e)),
                Err(err) => {
                    let lines = s.split('\n').count();
                    prop_assert!(err.line() >= 1 && err.line() <= lines, "{:?}", err);
                    prop_assert!(!err.to_string().is_empty());
                }
            }
        }

        #[test]
        fn prop_matching_never_panics(
            m in arb_matcher(),
            raw in (arb_ip(), 0u8..=255),
            peer in arb_ip(),
            host in proptest::option::of("\\PC{0,20}"),
        ) {
            let _ = m.matches(peer, host.as_deref());
            // Out-of-range user-built networks are clamped, not panicking.
            let net = ClientMatch::Net { addr: raw.0, prefix: raw.1 };
            let _ = net.matches(peer, host.as_deref());
            prop_assert!(ClientMatch::Any.matches(peer, host.as_deref()));
        }
    }
}
