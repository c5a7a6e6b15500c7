//! A game on the runner's own machine is also offered over a Unix socket.
//!
//! A step's round trip over a Unix socket is about 25 µs shorter than over loopback TCP
//! (docs/performance.md: one client and its game alone; about 20 µs of a runner's step in
//! `uerl bench`), and `uerl local` runs every game on the runners' machine. The compiled server, bound to a loopback address, also listens on an
//! abstract Unix socket named for that address; the compiled client, given a loopback
//! address, tries that name first and falls back to TCP when nothing listens there (any
//! game not served by uerl's compiled server). Abstract names live in the network
//! namespace, as loopback ports do (a pod's containers share both), and vanish with the
//! process that bound them. Unlike a port, any process may take a name first, so the
//! client uses a socket only when the process serving it runs as its own user
//! (SO_PEERCRED); a game of another user's is reached over TCP, as if no socket were
//! there.

use std::net::IpAddr;
use std::os::unix::net::{UnixListener, UnixStream};

/// The abstract socket name (leading NUL, tokio's and the kernel's convention) for a
/// game at `host:port`, if `host` is a loopback literal; None otherwise.
pub fn name(host: &str, port: u16) -> Option<String> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = if host == "localhost" { IpAddr::from([127, 0, 0, 1]) } else { host.parse().ok()? };
    ip.is_loopback().then(|| format!("\0uerl-game/{ip}:{port}"))
}

/// `name` for an address written `host:port`.
pub fn name_for_address(address: &str) -> Option<String> {
    let (host, port) = address.rsplit_once(':')?;
    name(host, port.parse().ok()?)
}

#[cfg(target_os = "linux")]
fn address(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(&name.as_bytes()[1..])
}

#[cfg(not(target_os = "linux"))]
fn address(_name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Listen on the abstract socket `name` (from `name`).
pub fn bind(name: &str) -> std::io::Result<UnixListener> {
    UnixListener::bind_addr(&address(name)?)
}

/// A blocking connection to `name` (the server's own, to wake its acceptor).
pub fn connect(name: &str) -> std::io::Result<UnixStream> {
    UnixStream::connect_addr(&address(name)?)
}

/// This process's user (effective uid): the one whose sockets the client trusts.
pub fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether the process serving `stream` runs as user `uid` (`own_uid()`, but for tests).
pub fn served_by(stream: &tokio::net::UnixStream, uid: u32) -> bool {
    stream.peer_cred().is_ok_and(|cred| cred.uid() == uid)
}
