//! A data-only reader of Python pickles: values are built, nothing is ever called.
//!
//! Python's `pickle.load` runs code: a `GLOBAL` opcode imports any callable (`os.system`) and
//! `REDUCE` calls it. This reader is a small stack machine over the opcodes of protocols 0 to 5
//! that build plain data — `None`, booleans, integers (up to 128 bits), floats, strings, bytes,
//! lists, tuples, dicts, sets, the memo — and accepts a global only from a fixed allowlist of
//! data types ([`ALLOWED_GLOBALS`]: `collections.OrderedDict`, `collections.Counter`, the
//! built-in `set` and `frozenset`), which `REDUCE` / `NEWOBJ` turn into values without running
//! anything. The tokenizer objects transformers 4.x pickles beside TransfoXL's vocabulary
//! ([`RECORD_GLOBALS`]) are kept as inert records (class name, arguments, state), never called
//! either. Any other global is refused with [`PickleError::Refused`] naming it, as are
//! persistent ids, extension codes, `INST` / `OBJ` and out-of-band buffers.
//!
//! A file written by PyTorch's `torch.save` is read too, [`read_file`] returning the object: the
//! legacy format (a magic number, the protocol version and the system info pickled before the
//! object) and the zip archive (its `data.pkl`), as long as it holds no tensors (their storages
//! are persistent ids, refused).

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// The globals a pickle may name: data types only.
pub const ALLOWED_GLOBALS: &[&str] = &[
    "collections.OrderedDict",
    "collections.Counter",
    "builtins.set",
    "builtins.frozenset",
    "__builtin__.set",
    "__builtin__.frozenset",
];

/// Classes whose instances are kept as inert records ([`PyValue::Record`]: the class name, the
/// arguments and the state the pickle gives), never called or built: the objects
/// transformers 4.x's `TransfoXLTokenizer` holds besides its vocabulary (a compiled regular
/// expression, the Moses normaliser, tokenizer and detokenizer, the added-tokens trie and
/// tokens), so that the `vocab.pkl` its `save_vocabulary` writes can be read for its data.
pub const RECORD_GLOBALS: &[&str] = &[
    "re._compile",
    "sacremoses.normalize.MosesPunctNormalizer",
    "sacremoses.tokenize.MosesTokenizer",
    "sacremoses.tokenize.MosesDetokenizer",
    "transformers.tokenization_utils.Trie",
    "tokenizers.AddedToken",
];

/// The magic number that starts a legacy `torch.save` file.
const TORCH_MAGIC: i128 = 0x1950a86a20f9469cfc6c;

/// Nesting deeper than this is refused (a self-referencing container included).
const MAX_DEPTH: usize = 256;

/// A Python value read from a pickle.
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An `int` (up to 128 bits).
    Int(i128),
    /// A `float`.
    Float(f64),
    /// A `str` (Python 2 `str` too, when it is UTF-8).
    Str(String),
    /// `bytes` or `bytearray` (or a Python 2 `str` that is not UTF-8).
    Bytes(Vec<u8>),
    /// A `list`.
    List(Vec<PyValue>),
    /// A `tuple`.
    Tuple(Vec<PyValue>),
    /// A `dict`, `collections.OrderedDict` or `collections.Counter`, in insertion order.
    Dict(DictKind, Vec<(PyValue, PyValue)>),
    /// A `set` or `frozenset`, in the pickle's order.
    Set(Vec<PyValue>),
    /// An instance of a class of [`RECORD_GLOBALS`], not built: the class (`module.name`), the
    /// arguments it would have been called with, and the state `BUILD` would have set.
    Record {
        /// `module.name` of the class.
        class: String,
        /// The arguments of `REDUCE` / `NEWOBJ`.
        args: Vec<PyValue>,
        /// The state of `BUILD` (`None` when the pickle sets none).
        state: Box<PyValue>,
    },
}

/// Which mapping a [`PyValue::Dict`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DictKind {
    /// `dict`.
    Dict,
    /// `collections.OrderedDict`.
    OrderedDict,
    /// `collections.Counter`.
    Counter,
}

impl PyValue {
    /// The value of key `key` of a mapping whose keys are strings.
    pub fn get(&self, key: &str) -> Option<&PyValue> {
        match self {
            PyValue::Dict(_, items) => items
                .iter()
                .find(|(k, _)| matches!(k, PyValue::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The Python type's name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            PyValue::None => "None",
            PyValue::Bool(_) => "bool",
            PyValue::Int(_) => "int",
            PyValue::Float(_) => "float",
            PyValue::Str(_) => "str",
            PyValue::Bytes(_) => "bytes",
            PyValue::List(_) => "list",
            PyValue::Tuple(_) => "tuple",
            PyValue::Dict(DictKind::Dict, _) => "dict",
            PyValue::Dict(DictKind::OrderedDict, _) => "OrderedDict",
            PyValue::Dict(DictKind::Counter, _) => "Counter",
            PyValue::Set(_) => "set",
            PyValue::Record { .. } => "object",
        }
    }
}

/// Why a pickle was not read.
#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    /// The pickle names a global outside [`ALLOWED_GLOBALS`]: it would run code.
    #[error(
        "{}: refused global {global} at byte {offset}: this data-only reader never runs pickle \
         code (allowed: collections.OrderedDict, collections.Counter, set, frozenset)",
        path.display()
    )]
    Refused {
        /// The file.
        path: PathBuf,
        /// `module.name`.
        global: String,
        /// Where in the file.
        offset: usize,
    },
    /// Not a pickle this reader understands (an unknown or refused opcode, a truncated file,
    /// a malformed stack).
    #[error("{}: not a readable pickle at byte {offset}: {message}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Where in the file.
        offset: usize,
        /// What is wrong.
        message: String,
    },
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Reads the object pickled in file `path` (a legacy `torch.save` file: its object).
pub fn read_file(path: &Path) -> Result<PyValue, PickleError> {
    let bytes = std::fs::read(path).map_err(|source| PickleError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    read_bytes(&bytes, path)
}

/// Reads the object pickled in `bytes`; `path` names them in errors. A zip archive (PyTorch's
/// `torch.save` since 1.6) is read through its `data.pkl` member.
pub fn read_bytes(bytes: &[u8], path: &Path) -> Result<PyValue, PickleError> {
    if bytes.starts_with(b"PK\x03\x04") {
        let data = torch_zip_data(bytes, path)?;
        return read_bytes(&data, path);
    }
    let mut m = Machine::new(bytes, path);
    let first = m.load()?;
    if first != PyValue::Int(TORCH_MAGIC) {
        return Ok(first);
    }
    // torch.save's legacy format: magic, protocol version, system info, then the object.
    let _protocol = m.load()?;
    let _sys_info = m.load()?;
    m.load()
}

/// The `data.pkl` member of a `torch.save` zip archive (`<name>/data.pkl`).
fn torch_zip_data(bytes: &[u8], path: &Path) -> Result<Vec<u8>, PickleError> {
    use std::io::Read;
    let bad = |message: String| PickleError::Malformed {
        path: path.to_path_buf(),
        offset: 0,
        message,
    };
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| bad(format!("a zip archive that cannot be read: {e}")))?;
    let mut found = None;
    for name in zip.file_names() {
        let name = name.map_err(|e| bad(format!("a bad member name: {e}")))?;
        if name == "data.pkl" || name.ends_with("/data.pkl") {
            found = Some(name.into_owned());
            break;
        }
    }
    let name = found
        .ok_or_else(|| bad("a zip archive without data.pkl (not a torch.save file)".into()))?;
    let mut member = zip
        .by_name(&name)
        .map_err(|e| bad(format!("{name}: {e}")))?;
    let mut data = Vec::new();
    member
        .read_to_end(&mut data)
        .map_err(|e| bad(format!("{name}: {e}")))?;
    if data.starts_with(b"PK\x03\x04") {
        return Err(bad(format!("{name} is itself a zip archive")));
    }
    Ok(data)
}

type Ref = Rc<RefCell<Obj>>;

/// A value under construction: containers hold references, so that a memoised container
/// filled later is filled everywhere it is referenced.
#[derive(Debug)]
enum Obj {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Ref>),
    Tuple(Vec<Ref>),
    Dict(DictKind, Vec<(Ref, Ref)>),
    Set(Vec<Ref>),
    /// An allowed global (a data type), before it is called.
    Global(&'static str),
    /// A class of [`RECORD_GLOBALS`], before it is "called".
    RecordClass(&'static str),
    /// An instance of such a class: its class, arguments and `BUILD` state.
    Record(&'static str, Vec<Ref>, Option<Ref>),
}

enum Item {
    Mark,
    Obj(Ref),
}

struct Machine<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
    stack: Vec<Item>,
    memo: HashMap<u64, Ref>,
}

fn obj(o: Obj) -> Ref {
    Rc::new(RefCell::new(o))
}

impl<'a> Machine<'a> {
    fn new(bytes: &'a [u8], path: &'a Path) -> Self {
        Self {
            bytes,
            pos: 0,
            path,
            stack: Vec::new(),
            memo: HashMap::new(),
        }
    }

    fn bad(&self, message: impl Into<String>) -> PickleError {
        PickleError::Malformed {
            path: self.path.to_path_buf(),
            offset: self.pos,
            message: message.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| self.bad(format!("the file ends inside a {n}-byte argument")))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }

    fn len(&mut self, n: usize) -> Result<usize, PickleError> {
        let len = self.le(n)?;
        let len = usize::try_from(len).map_err(|_| self.bad("length out of range"))?;
        if len > self.bytes.len() - self.pos {
            return Err(self.bad(format!("a length of {len} bytes runs past the file's end")));
        }
        Ok(len)
    }

    fn line(&mut self) -> Result<&'a str, PickleError> {
        let rest = &self.bytes[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.bad("the file ends inside a text argument"))?;
        let line = std::str::from_utf8(&rest[..end]).map_err(|_| self.bad("text is not UTF-8"))?;
        self.pos += end + 1;
        Ok(line)
    }

    fn push(&mut self, o: Obj) {
        self.stack.push(Item::Obj(obj(o)));
    }

    fn pop(&mut self) -> Result<Ref, PickleError> {
        match self.stack.pop() {
            Some(Item::Obj(o)) => Ok(o),
            Some(Item::Mark) => Err(self.bad("a mark where a value was expected")),
            None => Err(self.bad("the stack is empty")),
        }
    }

    fn top(&self) -> Result<Ref, PickleError> {
        match self.stack.last() {
            Some(Item::Obj(o)) => Ok(o.clone()),
            _ => Err(self.bad("no value on the stack")),
        }
    }

    /// The values above the topmost mark, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Ref>, PickleError> {
        let at = self
            .stack
            .iter()
            .rposition(|i| matches!(i, Item::Mark))
            .ok_or_else(|| self.bad("no mark on the stack"))?;
        let items = self.stack.split_off(at + 1);
        self.stack.pop();
        Ok(items
            .into_iter()
            .map(|i| match i {
                Item::Obj(o) => o,
                Item::Mark => unreachable!("marks above the topmost one"),
            })
            .collect())
    }

    fn global(&self, module: &str, name: &str, offset: usize) -> Result<Obj, PickleError> {
        let full = format!("{module}.{name}");
        if let Some(g) = RECORD_GLOBALS.iter().find(|g| **g == full) {
            return Ok(Obj::RecordClass(g));
        }
        match ALLOWED_GLOBALS.iter().find(|g| **g == full) {
            Some(g) => Ok(Obj::Global(g)),
            None => Err(PickleError::Refused {
                path: self.path.to_path_buf(),
                global: full,
                offset,
            }),
        }
    }

    fn memo_put(&mut self, key: u64) -> Result<(), PickleError> {
        let top = self.top()?;
        self.memo.insert(key, top);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Result<(), PickleError> {
        let o = self
            .memo
            .get(&key)
            .cloned()
            .ok_or_else(|| self.bad(format!("memo key {key} was never stored")))?;
        self.stack.push(Item::Obj(o));
        Ok(())
    }

    /// Key-value pairs into the mapping `target`.
    fn set_items(&self, target: &Ref, items: Vec<Ref>) -> Result<(), PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.bad("an odd number of items for a mapping"));
        }
        let mut t = target.borrow_mut();
        let Obj::Dict(_, entries) = &mut *t else {
            return Err(self.bad("items set on something that is not a mapping"));
        };
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            entries.push((k, v));
        }
        Ok(())
    }

    /// `callable(*args)` for an allowed global.
    fn call(&self, callable: &Ref, args: &Ref) -> Result<Obj, PickleError> {
        let name = match &*callable.borrow() {
            Obj::Global(g) => *g,
            Obj::RecordClass(g) => *g,
            _ => return Err(self.bad("a call of something that is not an allowed global")),
        };
        let args = match &*args.borrow() {
            Obj::Tuple(a) => a.clone(),
            _ => return Err(self.bad(format!("{name} called with arguments that are no tuple"))),
        };
        if matches!(&*callable.borrow(), Obj::RecordClass(_)) {
            // Kept as a record: nothing is called.
            return Ok(Obj::Record(name, args, None));
        }
        let kind = match name {
            "collections.OrderedDict" => DictKind::OrderedDict,
            "collections.Counter" => DictKind::Counter,
            _ => {
                // set / frozenset of an iterable (a list).
                let items = match args.as_slice() {
                    [] => Vec::new(),
                    [a] => match &*a.borrow() {
                        Obj::List(v) | Obj::Tuple(v) | Obj::Set(v) => v.clone(),
                        _ => return Err(self.bad(format!("{name} of something not a list"))),
                    },
                    _ => return Err(self.bad(format!("{name} called with several arguments"))),
                };
                return Ok(Obj::Set(items));
            }
        };
        // OrderedDict() / Counter() / either of a mapping or of a list of pairs.
        let entries = match args.as_slice() {
            [] => Vec::new(),
            [a] => match &*a.borrow() {
                Obj::Dict(_, e) => e.clone(),
                Obj::List(pairs) | Obj::Tuple(pairs) => pairs
                    .iter()
                    .map(|p| match &*p.borrow() {
                        Obj::List(kv) | Obj::Tuple(kv) if kv.len() == 2 => {
                            Ok((kv[0].clone(), kv[1].clone()))
                        }
                        _ => Err(self.bad(format!("{name} of a list whose items are no pairs"))),
                    })
                    .collect::<Result<_, _>>()?,
                _ => return Err(self.bad(format!("{name} of something not a mapping"))),
            },
            _ => return Err(self.bad(format!("{name} called with several arguments"))),
        };
        Ok(Obj::Dict(kind, entries))
    }

    /// Runs opcodes up to `STOP`; returns the value built.
    fn load(&mut self) -> Result<PyValue, PickleError> {
        self.stack.clear();
        self.memo.clear();
        loop {
            let at = self.pos;
            let op = self.u8()?;
            match op {
                0x80 => {
                    let proto = self.u8()?;
                    if proto > 5 {
                        return Err(self.bad(format!("pickle protocol {proto} is unknown")));
                    }
                }
                0x95 => {
                    self.take(8)?; // FRAME: a length hint only
                }
                b'.' => {
                    let top = self.pop()?;
                    return to_value(&top, 0).map_err(|m| self.bad(m));
                }
                b'(' => self.stack.push(Item::Mark),
                b'0' => {
                    self.stack
                        .pop()
                        .ok_or_else(|| self.bad("POP on an empty stack"))?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let top = self.top()?;
                    self.stack.push(Item::Obj(top));
                }
                b'N' => self.push(Obj::None),
                0x88 => self.push(Obj::Bool(true)),
                0x89 => self.push(Obj::Bool(false)),
                b'I' => {
                    let line = self.line()?;
                    let o = match line {
                        "01" => Obj::Bool(true),
                        "00" => Obj::Bool(false),
                        s => Obj::Int(s.parse().map_err(|_| self.bad(format!("bad INT {s:?}")))?),
                    };
                    self.push(o);
                }
                b'J' => {
                    let v = self.le(4)? as u32 as i32;
                    self.push(Obj::Int(v as i128));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Obj::Int(v as i128));
                }
                b'M' => {
                    let v = self.le(2)?;
                    self.push(Obj::Int(v as i128));
                }
                b'L' => {
                    let line = self.line()?;
                    let s = line.trim_end_matches('L');
                    let v = s
                        .parse()
                        .map_err(|_| self.bad(format!("bad LONG {line:?} (beyond 128 bits?)")))?;
                    self.push(Obj::Int(v));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        self.u8()? as usize
                    } else {
                        self.len(4)?
                    };
                    if n > 16 {
                        return Err(self.bad(format!("an integer of {n} bytes (beyond 128 bits)")));
                    }
                    let b = self.take(n)?;
                    let mut v: i128 = 0;
                    for (i, &x) in b.iter().enumerate() {
                        v |= (x as i128) << (8 * i);
                    }
                    // Two's complement of n bytes.
                    if n > 0 && n < 16 && b[n - 1] & 0x80 != 0 {
                        v -= 1i128 << (8 * n);
                    }
                    self.push(Obj::Int(v));
                }
                b'F' => {
                    let line = self.line()?;
                    let v = line
                        .parse()
                        .map_err(|_| self.bad(format!("bad FLOAT {line:?}")))?;
                    self.push(Obj::Float(v));
                }
                b'G' => {
                    let b = self.take(8)?;
                    self.push(Obj::Float(f64::from_be_bytes(b.try_into().unwrap())));
                }
                b'S' => {
                    // Python 2 str, quoted repr.
                    let line = self.line()?;
                    let s = line
                        .strip_prefix(['\'', '"'])
                        .and_then(|s| s.strip_suffix(['\'', '"']))
                        .ok_or_else(|| self.bad("STRING without quotes"))?;
                    self.push(Obj::Str(unescape(s)));
                }
                b'T' | b'U' => {
                    let n = if op == b'T' {
                        self.len(4)?
                    } else {
                        self.u8()? as usize
                    };
                    let b = self.take(n)?;
                    self.push(match std::str::from_utf8(b) {
                        Ok(s) => Obj::Str(s.to_string()),
                        Err(_) => Obj::Bytes(b.to_vec()),
                    });
                }
                b'V' => {
                    let line = self.line()?;
                    self.push(Obj::Str(unescape(line)));
                }
                b'X' | 0x8c | 0x8d => {
                    let n = match op {
                        b'X' => self.len(4)?,
                        0x8c => self.u8()? as usize,
                        _ => self.len(8)?,
                    };
                    let b = self.take(n)?;
                    let s = std::str::from_utf8(b).map_err(|_| self.bad("a str is not UTF-8"))?;
                    self.push(Obj::Str(s.to_string()));
                }
                b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match op {
                        b'B' => self.len(4)?,
                        b'C' => self.u8()? as usize,
                        _ => self.len(8)?,
                    };
                    let b = self.take(n)?;
                    self.push(Obj::Bytes(b.to_vec()));
                }
                b']' => self.push(Obj::List(Vec::new())),
                b')' => self.push(Obj::Tuple(Vec::new())),
                b'}' => self.push(Obj::Dict(DictKind::Dict, Vec::new())),
                0x8f => self.push(Obj::Set(Vec::new())),
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Obj::List(items));
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Obj::Tuple(items));
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        return Err(self.bad("TUPLE with too few values"));
                    }
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push(Obj::Tuple(items));
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let d = obj(Obj::Dict(DictKind::Dict, Vec::new()));
                    self.set_items(&d, items)?;
                    self.stack.push(Item::Obj(d));
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.push(Obj::Set(items));
                }
                b'a' => {
                    let v = self.pop()?;
                    let list = self.top()?;
                    match &mut *list.borrow_mut() {
                        Obj::List(l) => l.push(v),
                        _ => return Err(self.bad("APPEND to something that is not a list")),
                    }
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    let list = self.top()?;
                    match &mut *list.borrow_mut() {
                        Obj::List(l) => l.extend(items),
                        _ => return Err(self.bad("APPENDS to something that is not a list")),
                    }
                }
                0x90 => {
                    let items = self.pop_mark()?;
                    let set = self.top()?;
                    match &mut *set.borrow_mut() {
                        Obj::Set(s) => s.extend(items),
                        _ => return Err(self.bad("ADDITEMS to something that is not a set")),
                    }
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let d = self.top()?;
                    self.set_items(&d, vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let d = self.top()?;
                    self.set_items(&d, items)?;
                }
                b'p' => {
                    let line = self.line()?;
                    let key = line.parse().map_err(|_| self.bad("bad PUT key"))?;
                    self.memo_put(key)?;
                }
                b'q' => {
                    let key = self.u8()? as u64;
                    self.memo_put(key)?;
                }
                b'r' => {
                    let key = self.le(4)?;
                    self.memo_put(key)?;
                }
                0x94 => {
                    let key = self.memo.len() as u64;
                    self.memo_put(key)?;
                }
                b'g' => {
                    let line = self.line()?;
                    let key = line.parse().map_err(|_| self.bad("bad GET key"))?;
                    self.memo_get(key)?;
                }
                b'h' => {
                    let key = self.u8()? as u64;
                    self.memo_get(key)?;
                }
                b'j' => {
                    let key = self.le(4)?;
                    self.memo_get(key)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    let g = self.global(module, name, at)?;
                    self.push(g);
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (module, name) = match (&*module.borrow(), &*name.borrow()) {
                        (Obj::Str(m), Obj::Str(n)) => (m.clone(), n.clone()),
                        _ => return Err(self.bad("STACK_GLOBAL of values that are no strings")),
                    };
                    let g = self.global(&module, &name, at)?;
                    self.push(g);
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let o = self.call(&callable, &args)?;
                    self.push(o);
                }
                0x92 => {
                    let kwargs = self.pop()?;
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    if !matches!(&*kwargs.borrow(), Obj::Dict(_, e) if e.is_empty()) {
                        return Err(self.bad("NEWOBJ_EX with keyword arguments"));
                    }
                    let o = self.call(&callable, &args)?;
                    self.push(o);
                }
                b'b' => {
                    // BUILD: state for the object below it. A record keeps it as data; the
                    // allowed types carry none (an empty dict or None) beyond their items.
                    let state = self.pop()?;
                    let target = self.top()?;
                    if let Obj::Record(_, _, slot) = &mut *target.borrow_mut() {
                        *slot = Some(state);
                        continue;
                    }
                    let empty = match &*state.borrow() {
                        Obj::None => true,
                        Obj::Dict(_, e) => e.is_empty(),
                        _ => false,
                    };
                    if !empty {
                        return Err(self.bad("BUILD with a state: only plain data is read"));
                    }
                }
                b'P' | b'Q' => return Err(self.bad("a persistent id (refused: not plain data)")),
                0x82..=0x84 => return Err(self.bad("an extension code (refused: a global)")),
                b'i' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.global(module, name, at)?;
                    return Err(self.bad(format!("INST of {module}.{name}")));
                }
                b'o' => return Err(self.bad("OBJ (refused: builds an instance of a class)")),
                0x97 | 0x98 => return Err(self.bad("an out-of-band buffer (refused)")),
                _ => return Err(self.bad(format!("unknown opcode 0x{op:02x}"))),
            }
        }
    }
}

/// `raw-unicode-escape` / Python 2 repr escapes: `\xNN`, `\uNNNN`, `\UNNNNNNNN`, `\n`, `\\`,
/// `\'`; other bytes as they are.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let hex = |chars: &mut std::iter::Peekable<std::str::Chars>, n: usize| {
            let h: String = chars.by_ref().take(n).collect();
            u32::from_str_radix(&h, 16).ok().and_then(char::from_u32)
        };
        match chars.next() {
            Some('x') => out.extend(hex(&mut chars, 2)),
            Some('u') => out.extend(hex(&mut chars, 4)),
            Some('U') => out.extend(hex(&mut chars, 8)),
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(o) => out.push(o),
            None => out.push('\\'),
        }
    }
    out
}

/// The finished value of `r` (containers copied out of their references).
fn to_value(r: &Ref, depth: usize) -> Result<PyValue, String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "values nested deeper than {MAX_DEPTH} (or a container holding itself)"
        ));
    }
    let all = |v: &[Ref]| {
        v.iter()
            .map(|x| to_value(x, depth + 1))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(match &*r.borrow() {
        Obj::None => PyValue::None,
        Obj::Bool(b) => PyValue::Bool(*b),
        Obj::Int(i) => PyValue::Int(*i),
        Obj::Float(f) => PyValue::Float(*f),
        Obj::Str(s) => PyValue::Str(s.clone()),
        Obj::Bytes(b) => PyValue::Bytes(b.clone()),
        Obj::List(v) => PyValue::List(all(v)?),
        Obj::Tuple(v) => PyValue::Tuple(all(v)?),
        Obj::Set(v) => PyValue::Set(all(v)?),
        Obj::Dict(kind, e) => PyValue::Dict(
            *kind,
            e.iter()
                .map(|(k, v)| Ok((to_value(k, depth + 1)?, to_value(v, depth + 1)?)))
                .collect::<Result<Vec<_>, String>>()?,
        ),
        Obj::Record(class, args, state) => PyValue::Record {
            class: class.to_string(),
            args: all(args)?,
            state: Box::new(match state {
                Some(s) => to_value(s, depth + 1)?,
                None => PyValue::None,
            }),
        },
        Obj::Global(g) | Obj::RecordClass(g) => {
            return Err(format!("{g} left uncalled: a type is not data"));
        }
    })
}
