//! The Moses tokenizer, detokenizer and punctuation normalizer for English, as HF's
//! `TransfoXLTokenizer` (transformers 4.x) runs them through sacremoses: a port of
//! sacremoses 0.1's `MosesPunctNormalizer("en")`, `MosesTokenizer("en").tokenize(text,
//! aggressive_dash_splits=True, escape=False, protected_patterns=...)` and
//! `MosesDetokenizer("en").detokenize(tokens)`, which port Moses' Perl scripts
//! (`normalize-punctuation.perl`, `tokenizer.perl`, `detokenizer.perl`).
//!
//! Each rule is a regular expression applied left to right over the whole string, in
//! sacremoses' order. Perl's Unicode classes are Rust's: `IsAlpha` = `\p{Alphabetic}`,
//! `IsAlnum` = `\p{Alphabetic}` ∪ `\p{Nd}`, `IsN` = `\p{N}`, `IsSc` = `\p{Sc}`, `IsSo` =
//! `\p{So}`, `IsLower` = `char::is_lowercase`; they agree on ASCII and Latin text (sacremoses
//! reads Perl's tables of an older Unicode version, so rare letters may differ). Only English
//! rules are here (other languages' apostrophe, quote and number rules are not).

use std::sync::OnceLock;

use regex::Regex;

/// English non-breaking prefixes (sacremoses' `nonbreaking_prefix.en`): a token `X.` with one
/// of these `X` keeps its period. `No`, `Art`, `pp` are `#NUMERIC_ONLY#`: kept only before a
/// number.
const NONBREAKING_PREFIXES: &[&str] = &[
    "A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P", "Q", "R", "S",
    "T", "U", "V", "W", "X", "Y", "Z", "Adj", "Adm", "Adv", "Asst", "Bart", "Bldg", "Brig", "Bros",
    "Capt", "Cmdr", "Col", "Comdr", "Con", "Corp", "Cpl", "DR", "Dr", "Drs", "Ens", "Gen", "Gov",
    "Hon", "Hr", "Hosp", "Insp", "Lt", "MM", "MR", "MRS", "MS", "Maj", "Messrs", "Mlle", "Mme",
    "Mr", "Mrs", "Ms", "Msgr", "Op", "Ord", "Pfc", "Ph", "Prof", "Pvt", "Rep", "Reps", "Res",
    "Rev", "Rt", "Sen", "Sens", "Sfc", "Sgt", "Sr", "St", "Supt", "Surg", "v", "vs", "i.e", "rev",
    "e.g", "Rs", "Nos", "Nr", "Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
    "Dec",
];
const NUMERIC_ONLY_PREFIXES: &[&str] = &["No", "Art", "pp"];

const ALPHA: &str = r"\p{Alphabetic}";
const ALNUM: &str = r"\p{Alphabetic}\p{Nd}";

/// A list of `(pattern, replacement)` rules, compiled once.
struct Rules(Vec<(Regex, &'static str)>);

impl Rules {
    fn new(rules: &[(String, &'static str)]) -> Self {
        Self(
            rules
                .iter()
                .map(|(p, r)| (Regex::new(p).expect("a valid Moses rule"), *r))
                .collect(),
        )
    }

    fn apply(&self, mut text: String) -> String {
        for (re, rep) in &self.0 {
            text = re.replace_all(&text, *rep).into_owned();
        }
        text
    }
}

fn rules(
    cell: &'static OnceLock<Rules>,
    make: impl FnOnce() -> Vec<(String, &'static str)>,
) -> &'static Rules {
    cell.get_or_init(|| Rules::new(&make()))
}

/// `MosesPunctNormalizer("en")` (penn, quote-comma and number normalisation on):
/// parentheses and spacing, Unicode quotes and dashes to ASCII, `"` before `,`/`.` moved after
/// them, a no-break space between digits to `.`; then trimmed.
pub fn normalize_punctuation(text: &str) -> String {
    static R: OnceLock<Rules> = OnceLock::new();
    let r = rules(&R, || {
        let s = |p: &str, r: &'static str| (p.to_string(), r);
        vec![
            // EXTRA_WHITESPACE
            s(r"\r", ""),
            s(r"\(", " ("),
            s(r"\)", ") "),
            s(r" +", " "),
            s(r"\) ([.!:?;,])", ")${1}"),
            s(r"\( ", "("),
            s(r" \)", ")"),
            s(r"(\d) %", "${1}%"),
            s(r" :", ":"),
            s(r" ;", ";"),
            // NORMALIZE_UNICODE_IF_NOT_PENN (penn = true inserts it here)
            s(r"`", "'"),
            s(r"''", " \" "),
            // NORMALIZE_UNICODE
            s("„", "\""),
            s("“", "\""),
            s("”", "\""),
            s("–", "-"),
            s("—", " - "),
            s(r" +", " "),
            s("´", "'"),
            s("([a-zA-Z])‘([a-zA-Z])", "${1}'${2}"),
            s("([a-zA-Z])’([a-zA-Z])", "${1}'${2}"),
            s("‘", "'"),
            s("‚", "'"),
            s("’", "'"),
            s(r"''", "\""),
            s("´´", "\""),
            s("…", "..."),
            // FRENCH_QUOTES
            s("\u{a0}«\u{a0}", "\""),
            s("«\u{a0}", "\""),
            s("«", "\""),
            s("\u{a0}»\u{a0}", "\""),
            s("\u{a0}»", "\""),
            s("»", "\""),
            // HANDLE_PSEUDO_SPACES
            s("\u{a0}%", "%"),
            s("nº\u{a0}", "nº "),
            s("\u{a0}:", ":"),
            s("\u{a0}ºC", " ºC"),
            s("\u{a0}cm", " cm"),
            s("\u{a0}\\?", "?"),
            s("\u{a0}\\!", "!"),
            s("\u{a0};", ";"),
            s(",\u{a0}", ", "),
            s(r" +", " "),
            // EN_QUOTATION_FOLLOWED_BY_COMMA
            s(r#""([,.]+)"#, "${1}\""),
            // OTHER (numbers)
            s("(\\d)\u{a0}(\\d)", "${1}.${2}"),
        ]
    });
    r.apply(text.to_string()).trim().to_string()
}

/// Python's `str.split()`: runs of whitespace separate, none at the ends.
fn split(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

/// `c` is in `IsAlnum`.
fn is_alnum(c: char) -> bool {
    c.is_alphabetic() || is_nd(c)
}

/// `c` is a decimal digit (`\p{Nd}`, Python's and Perl's `\d`).
pub(crate) fn is_nd(c: char) -> bool {
    static ND: OnceLock<Regex> = OnceLock::new();
    let mut buf = [0u8; 4];
    ND.get_or_init(|| Regex::new(r"^\p{Nd}$").expect("valid"))
        .is_match(c.encode_utf8(&mut buf))
}

/// `([alnum])-(?=[alnum])` → `$1 @-@ ` (the lookahead consumes nothing, so `a-b-c` splits
/// twice): a hyphen between two alphanumerics.
fn aggressive_hyphen_split(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        if c == '-'
            && i > 0
            && is_alnum(chars[i - 1])
            && chars.get(i + 1).is_some_and(|&n| is_alnum(n))
        {
            out.push_str(" @-@ ");
        } else {
            out.push(c);
        }
    }
    out
}

/// `…` of two or more dots kept together as `DOTMULTI` / `DOTDOTMULTI` placeholders.
fn replace_multidots(text: &str) -> String {
    static R: OnceLock<(Regex, Regex, Regex)> = OnceLock::new();
    let (first, next, rest) = R.get_or_init(|| {
        (
            Regex::new(r"\.([\.]+)").expect("valid"),
            Regex::new(r"DOTMULTI\.([^\.])").expect("valid"),
            Regex::new(r"DOTMULTI\.").expect("valid"),
        )
    });
    let mut text = first.replace_all(text, " DOTMULTI${1}").into_owned();
    while rest.is_match(&text) {
        text = next.replace_all(&text, "DOTDOTMULTI ${1}").into_owned();
        text = rest.replace_all(&text, "DOTDOTMULTI").into_owned();
    }
    text
}

fn restore_multidots(text: &str) -> String {
    let mut text = text.to_string();
    while text.contains("DOTDOTMULTI") {
        text = text.replace("DOTDOTMULTI", "DOTMULTI.");
    }
    text.replace("DOTMULTI", ".")
}

/// A token `X.` keeps its period when `X` holds a period and a letter (`U.S.`), is a
/// non-breaking prefix (`Mr.`), or the next token starts lower-case; `No.` / `Art.` / `pp.`
/// keep it before a number; every other final period becomes its own token.
fn handle_nonbreaking_prefixes(text: &str) -> String {
    let mut tokens = split(text);
    let n = tokens.len();
    for i in 0..n {
        let token = &tokens[i];
        let Some(prefix) = token
            .strip_suffix('.')
            .filter(|p| !p.is_empty() && !p.chars().any(char::is_whitespace))
        else {
            continue;
        };
        let prefix = prefix.to_string();
        let next = tokens.get(i + 1);
        let keep = (prefix.contains('.') && prefix.chars().any(char::is_alphabetic))
            || NONBREAKING_PREFIXES.contains(&prefix.as_str())
            || next.is_some_and(|t| t.chars().next().is_some_and(char::is_lowercase))
            || (NUMERIC_ONLY_PREFIXES.contains(&prefix.as_str())
                && next.is_some_and(|t| t.starts_with(|c: char| c.is_ascii_digit())));
        if !keep {
            tokens[i] = format!("{prefix} .");
        }
    }
    tokens.join(" ")
}

/// `MosesTokenizer("en").tokenize(text, aggressive_dash_splits=True, escape=False,
/// protected_patterns=protected)`: `protected` strings (matched case-insensitively) stay
/// whole tokens.
pub fn tokenize(text: &str, protected: &[String]) -> Vec<String> {
    static START: OnceLock<Rules> = OnceLock::new();
    static PAD: OnceLock<Rules> = OnceLock::new();
    static MIDDLE: OnceLock<Rules> = OnceLock::new();
    static END: OnceLock<Rules> = OnceLock::new();
    let s = |p: String, r: &'static str| (p, r);
    // DEDUPLICATE_SPACE, ASCII_JUNK
    let start = rules(&START, || {
        vec![s(r"\s+".into(), " "), s(r"[\x00-\x1f]".into(), "")]
    });
    let mut text = start.apply(text.to_string());
    // Protected patterns → placeholders (longest first), restored at the end.
    let mut found: Vec<String> = Vec::new();
    for p in protected {
        let re = Regex::new(&format!("(?i){}", regex::escape(p))).expect("escaped");
        found.extend(re.find_iter(&text).map(|m| m.as_str().to_string()));
    }
    let mut order: Vec<usize> = (0..found.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(found[i].len()));
    for &i in &order {
        text = text.replace(&found[i], &format!("THISISPROTECTED{i:03}"));
    }
    let text = text.trim().to_string();
    // PAD_NOT_ISALNUM
    let pad = rules(&PAD, || {
        vec![s(format!(r"([^{ALNUM}\s\.'`,\-])"), " ${1} ")]
    });
    let text = pad.apply(text);
    let text = aggressive_hyphen_split(&text);
    let text = replace_multidots(&text);
    // COMMA_SEPARATE_1..3, then ENGLISH_SPECIFIC_APOSTROPHE 1..5
    let middle = rules(&MIDDLE, || {
        vec![
            s(r"([^\p{N}])[,]".into(), "${1} , "),
            s(r"[,]([^\p{N}])".into(), " , ${1}"),
            s(r"([\p{N}])[,]$".into(), "${1} , "),
            s(format!(r"([^{ALPHA}])[']([^{ALPHA}])"), "${1} ' ${2}"),
            s(format!(r"([^{ALPHA}\p{{N}}])[']([{ALPHA}])"), "${1} ' ${2}"),
            s(format!(r"([{ALPHA}])[']([^{ALPHA}])"), "${1} ' ${2}"),
            s(format!(r"([{ALPHA}])[']([{ALPHA}])"), "${1} '${2}"),
            s(r"([\p{N}])[']([s])".into(), "${1} '${2}"),
        ]
    });
    let text = middle.apply(text);
    let text = handle_nonbreaking_prefixes(&text);
    // DEDUPLICATE_SPACE + strip, TRAILING_DOT_APOSTROPHE
    let end = rules(&END, || vec![s(r"\s+".into(), " ")]);
    let text = end.apply(text).trim().to_string();
    static TRAILING: OnceLock<Regex> = OnceLock::new();
    let trailing = TRAILING.get_or_init(|| Regex::new(r"\.' ?$").expect("valid"));
    let mut text = trailing.replace_all(&text, " . ' ").into_owned();
    for (i, f) in found.iter().enumerate() {
        text = text.replace(&format!("THISISPROTECTED{i:03}"), f);
    }
    split(&restore_multidots(&text))
}

/// sacremoses' `is_cjk` (its ranges, with their exclusive ends).
fn is_cjk(c: char) -> bool {
    const RANGES: &[(u32, u32)] = &[
        (4352, 4607),
        (11904, 42191),
        (43072, 43135),
        (44032, 55215),
        (63744, 64255),
        (65072, 65103),
        (65381, 65500),
        (94208, 101119),
        (110592, 110895),
        (110960, 111359),
        (131072, 196607),
    ];
    let c = c as u32;
    for &(start, end) in RANGES {
        if c < end {
            return c > start;
        }
    }
    false
}

/// `MosesDetokenizer("en").detokenize(tokens)`: `@-@` joins, XML entities unescaped,
/// punctuation attached to the word before, currency symbols and opening brackets to the word
/// after, `'s`-style contractions attached, quotes paired (opening ones attach to the next
/// word, closing ones to the previous).
pub fn detokenize(tokens: &[String]) -> String {
    static R: OnceLock<Rules> = OnceLock::new();
    static CLASSES: OnceLock<(Regex, Regex, Regex, Regex)> = OnceLock::new();
    let unescape = rules(&R, || {
        let s = |p: &str, r: &'static str| (p.to_string(), r);
        vec![
            s(r" \@\-\@ ", "-"),
            s(r"&bar;", "|"),
            s(r"&#124;", "|"),
            s(r"&lt;", "<"),
            s(r"&gt;", ">"),
            s(r"&bra;", "["),
            s(r"&ket;", "]"),
            s(r"&quot;", "\""),
            s(r"&apos;", "'"),
            s(r"&#91;", "["),
            s(r"&#93;", "]"),
            s(r"&amp;", "&"),
        ]
    });
    let (currency, punct, contraction, open_quote) = CLASSES.get_or_init(|| {
        (
            Regex::new(r"^[\p{Sc}\(\[\{¿¡]+$").expect("valid"),
            Regex::new(r"^[,\.\?!:;\\%\}\]\)]+$").expect("valid"),
            Regex::new(&format!(r"^['][{ALPHA}]")).expect("valid"),
            Regex::new(r#"^['"„“`]+$"#).expect("valid"),
        )
    });
    let text = unescape.apply(format!(" {} ", tokens.join(" ")));
    let tokens = split(&text);
    let mut out = String::new();
    let mut prepend = " ";
    let mut quotes: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, token) in tokens.iter().enumerate() {
        let first = token.chars().next().expect("split gives non-empty tokens");
        if is_cjk(first) {
            let prev_cjk = i > 0 && tokens[i - 1].chars().last().is_some_and(is_cjk);
            if !prev_cjk {
                out.push_str(prepend);
            }
            out.push_str(token);
            prepend = " ";
        } else if currency.is_match(token) {
            out.push_str(prepend);
            out.push_str(token);
            prepend = "";
        } else if punct.is_match(token) || (i > 0 && contraction.is_match(token)) {
            // Punctuation, and English contractions (`'s`, `'ve`), attach to the word before.
            out.push_str(token);
            prepend = " ";
        } else if open_quote.is_match(token) {
            let normalized = if token.chars().all(|c| matches!(c, '„' | '“' | '”')) {
                "\"".to_string()
            } else {
                token.clone()
            };
            let count = quotes.entry(normalized).or_insert(0);
            if count.is_multiple_of(2) {
                if token == "'" && i > 0 && tokens[i - 1].ends_with('s') {
                    out.push_str(token);
                    prepend = " ";
                } else {
                    out.push_str(prepend);
                    out.push_str(token);
                    prepend = "";
                    *count += 1;
                }
            } else {
                out.push_str(token);
                prepend = " ";
                *count += 1;
            }
        } else {
            out.push_str(prepend);
            out.push_str(token);
            prepend = " ";
        }
    }
    static SPACES: OnceLock<Regex> = OnceLock::new();
    let spaces = SPACES.get_or_init(|| Regex::new(r" {2,}").expect("valid"));
    spaces.replace_all(&out, " ").trim().to_string()
}
