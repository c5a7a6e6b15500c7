//! A blocking gRPC unary-call transport for Python: tonic over a current-thread runtime.

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel as TonicChannel, Endpoint};
use tonic::{Code, Status};

create_exception!(
    uerl_native,
    RpcError,
    PyException,
    "A failed call: args are (gRPC status code as int, details)."
);

/// Requests and replies pass through as bytes: Python (or `StepCodec`) owns the messages.
#[derive(Clone, Copy, Default)]
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

fn rpc_error(code: Code, details: impl Into<String>) -> PyErr {
    RpcError::new_err((code as i32, details.into()))
}

/// Whether `address` answers an HTTP/2 preface with its SETTINGS: what "ready" means for
/// gRPC Python too. A TCP accept alone is not enough: a game still loading, or a TLS
/// server spoken to in plaintext, accepts and then never answers.
async fn speaks_http2(address: &str) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    const SETTINGS: u8 = 0x4;
    let mut stream = tokio::net::TcpStream::connect(address).await.map_err(|e| e.to_string())?;
    stream.write_all(PREFACE).await.map_err(|e| e.to_string())?;
    let mut header = [0u8; 9];
    stream
        .read_exact(&mut header)
        .await
        .map_err(|e| format!("no HTTP/2 answer: {e}"))?;
    if header[3] != SETTINGS {
        return Err("the answer is not HTTP/2".into());
    }
    Ok(())
}

/// Transport failures arrive as UNKNOWN "transport error": a connection that timed out
/// (a listener that never speaks HTTP/2) is a game that did not answer in time; the rest
/// (refused, reset, GOAWAY) mean the game went away, which is what UNAVAILABLE says.
fn classify(status: Status) -> PyErr {
    let mut details = status.message().to_string();
    let mut source = std::error::Error::source(&status);
    while let Some(err) = source {
        details.push_str(": ");
        details.push_str(&err.to_string());
        source = err.source();
    }
    let code = match status.code() {
        _ if details.contains("Timeout expired") => Code::DeadlineExceeded,
        Code::Unknown if status.message().contains("transport error") => Code::Unavailable,
        other => other,
    };
    rpc_error(code, details)
}

#[pyclass(module = "uerl_native")]
pub struct Channel {
    runtime: tokio::runtime::Runtime,
    endpoint: Endpoint,
    address: String,
    channel: Option<TonicChannel>,
    max_message_bytes: usize,
}

#[pymethods]
impl Channel {
    /// A plaintext channel to `host:port`; nothing is connected until `wait_ready`.
    #[new]
    #[pyo3(signature = (address, max_message_bytes, keepalive_s=20.0, keepalive_timeout_s=10.0))]
    fn new(
        address: &str,
        max_message_bytes: usize,
        keepalive_s: f64,
        keepalive_timeout_s: f64,
    ) -> PyResult<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| rpc_error(Code::Internal, format!("tokio runtime: {e}")))?;
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| rpc_error(Code::InvalidArgument, format!("bad address {address:?}: {e}")))?
            // Pings only while a call is in flight (the runtime runs only then): a vanished
            // game is detected without tripping a server's idle ping-abuse limit.
            .http2_keep_alive_interval(Duration::from_secs_f64(keepalive_s))
            .keep_alive_timeout(Duration::from_secs_f64(keepalive_timeout_s))
            .keep_alive_while_idle(false)
            .tcp_nodelay(true);
        Ok(Self { runtime, endpoint, address: address.to_string(), channel: None, max_message_bytes })
    }

    /// Connect, retrying with backoff until `timeout_s`: a game may still be starting.
    fn wait_ready(&mut self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        if self.channel.is_some() {
            return Ok(());
        }
        let endpoint = self.endpoint.clone();
        let address = self.address.clone();
        let result = py.allow_threads(|| {
            self.runtime.block_on(async move {
                let deadline = Instant::now() + Duration::from_secs_f64(timeout_s.max(0.0));
                let mut backoff = Duration::from_millis(20);
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let attempt = endpoint.clone().connect_timeout(left.max(Duration::from_millis(1)));
                    let connect = async {
                        speaks_http2(&address).await?;
                        attempt.connect().await.map_err(|e| e.to_string())
                    };
                    match tokio::time::timeout(left, connect).await {
                        Ok(Ok(channel)) => return Ok(channel),
                        Ok(Err(err)) if Instant::now() + backoff < deadline => {
                            let _ = err;
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_millis(500));
                        }
                        Ok(Err(err)) => {
                            return Err(format!("no connection to {address} within {timeout_s} s: {err}"))
                        }
                        Err(_) => return Err(format!("no connection to {address} within {timeout_s} s")),
                    }
                }
            })
        });
        match result {
            Ok(channel) => {
                self.channel = Some(channel);
                Ok(())
            }
            Err(msg) => Err(rpc_error(Code::Unavailable, msg)),
        }
    }

    /// One unary call, e.g. `call("/Schola.GymService/UpdateState", request, 60.0)`.
    fn call<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        request: &[u8],
        timeout_s: f64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let Some(channel) = self.channel.clone() else {
            return Err(rpc_error(Code::Unavailable, "not connected"));
        };
        let path = http::uri::PathAndQuery::try_from(method)
            .map_err(|e| rpc_error(Code::InvalidArgument, format!("bad method {method:?}: {e}")))?;
        let body = Bytes::copy_from_slice(request);
        let max = self.max_message_bytes;
        let timeout = Duration::from_secs_f64(timeout_s.max(0.0));
        let reply: Result<Bytes, PyErr> = py.allow_threads(|| {
            self.runtime.block_on(async move {
                let mut grpc = tonic::client::Grpc::new(channel)
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max);
                let call = async {
                    grpc.ready().await.map_err(|e| {
                        rpc_error(Code::Unavailable, format!("channel not ready: {e}"))
                    })?;
                    let mut req = tonic::Request::new(body);
                    req.set_timeout(timeout);
                    grpc.unary(req, path, RawCodec)
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err(classify)
                };
                match tokio::time::timeout(timeout, call).await {
                    Ok(result) => result,
                    Err(_) => Err(rpc_error(Code::DeadlineExceeded, "deadline exceeded")),
                }
            })
        });
        Ok(PyBytes::new(py, &reply?))
    }

    /// Drop the connection; the object can `wait_ready` again.
    fn close(&mut self) {
        self.channel = None;
    }

    #[getter]
    fn connected(&self) -> bool {
        self.channel.is_some()
    }
}
