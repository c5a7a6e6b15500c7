//! Just enough HTTP/2 (RFC 9113) to serve gRPC unary calls, over a blocking TCP socket:
//! the server side of `uerl mock-ue --transport native` (`server::Server`), whose clients
//! are grpcio and uerl's compiled client (which is on the `h2` crate, `transport.rs`). A
//! reply is one write (HEADERS, DATA and trailers together). Header blocks we send use HPACK
//! literals without indexing (no table state to keep in step); blocks we receive go
//! through a full HPACK decoder (the `hpack` crate), since peers do index and use
//! Huffman coding. Flow control is honoured both ways; we advertise windows large
//! enough that a reply never waits for our WINDOW_UPDATE.

use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

const DEFAULT_WINDOW: i64 = 65_535;
const DEFAULT_MAX_FRAME: usize = 16_384;
/// What we let a peer send before it must wait for us: more than any reply.
const OUR_WINDOW: i64 = 1 << 30;

pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

pub type Headers = Vec<(Vec<u8>, Vec<u8>)>;

pub fn header<'h>(headers: &'h Headers, name: &[u8]) -> Option<&'h [u8]> {
    headers.iter().find(|(n, _)| n.as_slice() == name).map(|(_, v)| v.as_slice())
}

pub fn protocol_error(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn put_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

// ---------------------------------------------------------------------------- HPACK out

fn hpack_int(out: &mut Vec<u8>, first: u8, prefix_bits: u32, mut value: usize) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128 + 128) as u8);
        value /= 128;
    }
    out.push(value as u8);
}

fn hpack_string(out: &mut Vec<u8>, s: &[u8]) {
    hpack_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// A header block under construction: static-table entries and literals, never indexed.
#[derive(Default)]
pub struct Block(pub Vec<u8>);

impl Block {
    /// An entry of the static table (RFC 7541, appendix A), e.g. 3 = `:method: POST`.
    pub fn indexed(mut self, index: usize) -> Self {
        hpack_int(&mut self.0, 0x80, 7, index);
        self
    }
    /// Literal value for a name of the static table, e.g. 4 = `:path`.
    pub fn named(mut self, name_index: usize, value: &[u8]) -> Self {
        hpack_int(&mut self.0, 0x00, 4, name_index);
        hpack_string(&mut self.0, value);
        self
    }
    pub fn literal(mut self, name: &[u8], value: &[u8]) -> Self {
        self.0.push(0x00);
        hpack_string(&mut self.0, name);
        hpack_string(&mut self.0, value);
        self
    }
}

// ---------------------------------------------------------------------------- connection

pub struct Connection {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    decoder: hpack::Decoder<'static>,
    peer_initial_window: i64,
    peer_max_frame: usize,
    send_window: i64,
    stream_windows: HashMap<u32, i64>,
    unacknowledged: i64,
}

/// Control frames are handled inside `Connection`; the rest go to the caller.
pub enum Incoming {
    Headers { stream: u32, end_stream: bool, headers: Headers },
    Data { stream: u32, end_stream: bool, data: Vec<u8> },
    Reset { stream: u32, code: u32 },
    GoAway { debug: String },
    Control,
}

impl Connection {
    pub fn new(socket: TcpStream) -> io::Result<Self> {
        socket.set_nodelay(true)?;
        let reader = BufReader::with_capacity(1 << 16, socket.try_clone()?);
        Ok(Self {
            writer: socket,
            reader,
            decoder: hpack::Decoder::new(),
            peer_initial_window: DEFAULT_WINDOW,
            peer_max_frame: DEFAULT_MAX_FRAME,
            send_window: DEFAULT_WINDOW,
            stream_windows: HashMap::new(),
            unacknowledged: 0,
        })
    }

    /// Our SETTINGS (windows large enough to never throttle a request) and the matching
    /// connection-level WINDOW_UPDATE.
    pub fn start(&mut self) -> io::Result<()> {
        let mut out = Vec::with_capacity(64);
        let mut settings = Vec::new();
        settings.extend_from_slice(&SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes());
        settings.extend_from_slice(&(OUR_WINDOW as u32).to_be_bytes());
        put_frame(&mut out, SETTINGS, 0, 0, &settings);
        put_frame(&mut out, WINDOW_UPDATE, 0, 0, &((OUR_WINDOW - DEFAULT_WINDOW) as u32).to_be_bytes());
        self.writer.write_all(&out)
    }

    pub fn read_preface(&mut self) -> io::Result<()> {
        let mut preface = [0u8; 24];
        self.reader.read_exact(&mut preface)?;
        if preface != PREFACE {
            return Err(protocol_error("not an HTTP/2 client preface"));
        }
        Ok(())
    }

    fn read_frame(&mut self) -> io::Result<Frame> {
        let mut head = [0u8; 9];
        self.reader.read_exact(&mut head)?;
        let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
        if len > DEFAULT_MAX_FRAME {
            // We never raise SETTINGS_MAX_FRAME_SIZE, so a bigger frame is a protocol error.
            return Err(protocol_error(format!("frame of {len} bytes exceeds 16384")));
        }
        let mut payload = vec![0u8; len];
        self.reader.read_exact(&mut payload)?;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        Ok(Frame { kind: head[3], flags: head[4], stream, payload })
    }

    fn apply_settings(&mut self, frame: &Frame) -> io::Result<()> {
        if frame.payload.len() % 6 != 0 {
            return Err(protocol_error("SETTINGS payload is not a multiple of 6"));
        }
        for entry in frame.payload.chunks_exact(6) {
            let id = u16::from_be_bytes([entry[0], entry[1]]);
            let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
            match id {
                SETTINGS_INITIAL_WINDOW_SIZE => {
                    let delta = value as i64 - self.peer_initial_window;
                    self.peer_initial_window = value as i64;
                    for window in self.stream_windows.values_mut() {
                        *window += delta;
                    }
                }
                SETTINGS_MAX_FRAME_SIZE => self.peer_max_frame = value as usize,
                SETTINGS_HEADER_TABLE_SIZE => {} // we never index what we send
                _ => {}
            }
        }
        let mut ack = Vec::with_capacity(9);
        put_frame(&mut ack, SETTINGS, ACK, 0, &[]);
        self.writer.write_all(&ack)
    }

    /// The next frame that is not connection control (SETTINGS, PING, WINDOW_UPDATE).
    pub fn next(&mut self) -> io::Result<Incoming> {
        loop {
            let frame = self.read_frame()?;
            match self.dispatch(frame)? {
                Incoming::Control => continue,
                other => return Ok(other),
            }
        }
    }

    fn dispatch(&mut self, frame: Frame) -> io::Result<Incoming> {
        let Frame { kind, flags, stream, mut payload } = frame;
        match kind {
            DATA => {
                self.consumed(payload.len())?;
                strip_padding(&mut payload, flags)?;
                Ok(Incoming::Data { stream, end_stream: flags & END_STREAM != 0, data: payload })
            }
            HEADERS => {
                strip_padding(&mut payload, flags)?;
                if flags & PRIORITY != 0 {
                    if payload.len() < 5 {
                        return Err(protocol_error("HEADERS priority fields truncated"));
                    }
                    payload.drain(..5);
                }
                let mut block = payload;
                let mut end_headers = flags & END_HEADERS != 0;
                while !end_headers {
                    let next = self.read_frame()?;
                    if next.kind != CONTINUATION || next.stream != stream {
                        return Err(protocol_error("header block interrupted"));
                    }
                    block.extend_from_slice(&next.payload);
                    end_headers = next.flags & END_HEADERS != 0;
                }
                // Every block is decoded, whatever its stream: the HPACK table is shared.
                let headers = self
                    .decoder
                    .decode(&block)
                    .map_err(|e| protocol_error(format!("HPACK: {e:?}")))?;
                Ok(Incoming::Headers { stream, end_stream: flags & END_STREAM != 0, headers })
            }
            RST_STREAM => {
                self.stream_windows.remove(&stream);
                let code = payload.get(..4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                Ok(Incoming::Reset { stream, code })
            }
            SETTINGS => {
                if flags & ACK == 0 {
                    self.apply_settings(&Frame { kind, flags, stream, payload })?;
                }
                Ok(Incoming::Control)
            }
            PING => {
                if flags & ACK == 0 {
                    let mut pong = Vec::with_capacity(17);
                    put_frame(&mut pong, PING, ACK, 0, &payload);
                    self.writer.write_all(&pong)?;
                }
                Ok(Incoming::Control)
            }
            WINDOW_UPDATE => {
                let increment = payload
                    .get(..4)
                    .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff)
                    as i64;
                if stream == 0 {
                    self.send_window += increment;
                } else if let Some(window) = self.stream_windows.get_mut(&stream) {
                    *window += increment;
                }
                Ok(Incoming::Control)
            }
            GOAWAY => {
                let debug = String::from_utf8_lossy(payload.get(8..).unwrap_or(&[])).into_owned();
                Ok(Incoming::GoAway { debug })
            }
            PUSH_PROMISE => Err(protocol_error("PUSH_PROMISE, though push is disabled")),
            _ => Ok(Incoming::Control), // PRIORITY and unknown frame types are ignored
        }
    }

    /// Count received DATA against our connection window; top it up past half.
    fn consumed(&mut self, bytes: usize) -> io::Result<()> {
        self.unacknowledged += bytes as i64;
        if self.unacknowledged > OUR_WINDOW / 2 {
            let mut out = Vec::with_capacity(13);
            put_frame(&mut out, WINDOW_UPDATE, 0, 0, &(self.unacknowledged as u32).to_be_bytes());
            self.unacknowledged = 0;
            self.writer.write_all(&out)?;
        }
        Ok(())
    }

    /// HEADERS, then `body` as DATA (gRPC-framed by the caller), then optional trailers,
    /// in as few writes as flow control allows (one, for anything that fits the window).
    /// Frames for other streams that arrive while waiting for window are handed to
    /// `park` so the caller can serve them later.
    pub fn send(
        &mut self,
        stream: u32,
        headers: &Block,
        body: Option<&[u8]>,
        trailers: Option<&Block>,
        park: &mut Vec<Incoming>,
    ) -> io::Result<()> {
        self.stream_windows.entry(stream).or_insert(self.peer_initial_window);
        let mut out = Vec::with_capacity(64 + body.map_or(0, <[u8]>::len));
        let headers_end = if body.is_none() && trailers.is_none() { END_STREAM } else { 0 };
        self.put_block(&mut out, stream, headers_end, &headers.0);
        if let Some(body) = body {
            let mut rest = body;
            loop {
                let window = self.send_window.min(self.stream_windows[&stream]).max(0) as usize;
                let take = rest.len().min(window).min(self.peer_max_frame);
                if take == 0 && !rest.is_empty() {
                    self.writer.write_all(&out)?;
                    out.clear();
                    self.wait_for_window(stream, park)?;
                    continue;
                }
                let last = take == rest.len();
                let flags = if last && trailers.is_none() { END_STREAM } else { 0 };
                put_frame(&mut out, DATA, flags, stream, &rest[..take]);
                self.send_window -= take as i64;
                *self.stream_windows.get_mut(&stream).unwrap() -= take as i64;
                rest = &rest[take..];
                if last {
                    break;
                }
            }
        }
        if let Some(trailers) = trailers {
            self.put_block(&mut out, stream, END_STREAM, &trailers.0);
        }
        self.stream_windows.remove(&stream);
        self.writer.write_all(&out)
    }

    fn put_block(&self, out: &mut Vec<u8>, stream: u32, end_stream: u8, block: &[u8]) {
        let mut chunks = block.chunks(self.peer_max_frame.max(1)).peekable();
        let mut first = true;
        if block.is_empty() {
            put_frame(out, HEADERS, END_HEADERS | end_stream, stream, &[]);
            return;
        }
        while let Some(chunk) = chunks.next() {
            let end = if chunks.peek().is_none() { END_HEADERS } else { 0 };
            let kind = if first { HEADERS } else { CONTINUATION };
            let flags = if first { end | end_stream } else { end };
            put_frame(out, kind, flags, stream, chunk);
            first = false;
        }
    }

    fn wait_for_window(&mut self, stream: u32, park: &mut Vec<Incoming>) -> io::Result<()> {
        loop {
            let frame = self.read_frame()?;
            let was_update = frame.kind == WINDOW_UPDATE;
            match self.dispatch(frame)? {
                Incoming::Control if was_update => {
                    let window = self.send_window.min(self.stream_windows[&stream]);
                    if window > 0 {
                        return Ok(());
                    }
                }
                Incoming::Control => {}
                Incoming::Reset { stream: s, code } if s == stream => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        format!("stream reset by the peer (code {code})"),
                    ))
                }
                Incoming::GoAway { debug, .. } => {
                    return Err(io::Error::new(io::ErrorKind::ConnectionAborted, format!("GOAWAY {debug}")))
                }
                other => park.push(other),
            }
        }
    }
}

fn strip_padding(payload: &mut Vec<u8>, flags: u8) -> io::Result<()> {
    if flags & PADDED == 0 {
        return Ok(());
    }
    let pad = *payload.first().ok_or_else(|| protocol_error("padded frame without pad length"))? as usize;
    if pad + 1 > payload.len() {
        return Err(protocol_error("padding longer than the frame"));
    }
    payload.truncate(payload.len() - pad);
    payload.remove(0);
    Ok(())
}

// ---------------------------------------------------------------------------- gRPC bits

/// A message with gRPC's 5-byte length prefix (uncompressed).
pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The message inside a gRPC length-prefixed body.
pub fn grpc_unframe(body: &[u8]) -> Result<&[u8], String> {
    if body.len() < 5 {
        return Err(format!("body of {} bytes has no gRPC message frame", body.len()));
    }
    if body[0] != 0 {
        return Err("compressed message, but no compression was negotiated".into());
    }
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() != 5 + length {
        return Err(format!("gRPC frame says {length} bytes, carries {}", body.len() - 5));
    }
    Ok(&body[5..])
}

pub fn percent_encode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}
