//! `malachi health`: asks a broker's `/ready` over HTTP and exits 0 only when it can serve, so a
//! container's health check, a systemd unit or a script needs nothing but the binary.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long the whole check may take: a health check that hangs is worse than one that fails.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);

/// The most of the answer read: `/ready` answers a status line and one sentence.
const ANSWER_BYTES_MAX: u64 = 16 * 1024;

#[derive(clap::Args, Debug)]
pub struct HealthArgs {
    /// The broker's HTTP address (host:port) [env: MALACHI_HEALTH_ADDRESS]
    /// [default: 127.0.0.1 and MALACHI_DASHBOARD_PORT, else 4041]
    #[arg(long)]
    address: Option<String>,
}

pub fn run(args: HealthArgs) -> Result<(), String> {
    let address = args.address.or_else(|| std::env::var("MALACHI_HEALTH_ADDRESS").ok());
    let address = address.unwrap_or_else(|| {
        let port = std::env::var("MALACHI_DASHBOARD_PORT").unwrap_or_else(|_| "4041".into());
        format!("127.0.0.1:{port}")
    });
    let answer = ask_ready(&address).map_err(|error| format!("{address}: {error}"))?;
    let verdict = verdict(&answer);
    match &verdict {
        Ok(()) => println!("ready"),
        Err(reason) => eprintln!("not ready: {reason}"),
    }
    verdict.map_err(|_| format!("{address} is not ready"))
}

fn ask_ready(address: &str) -> std::io::Result<String> {
    let target = address.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "the address resolves to nothing")
    })?;
    let mut stream = TcpStream::connect_timeout(&target, HEALTH_TIMEOUT)?;
    stream.set_read_timeout(Some(HEALTH_TIMEOUT))?;
    stream.set_write_timeout(Some(HEALTH_TIMEOUT))?;
    write!(stream, "GET /ready HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.take(ANSWER_BYTES_MAX).read_to_string(&mut answer)?;
    Ok(answer)
}

/// Ready when the answer's status is 200; otherwise its body, the broker's reason.
fn verdict(answer: &str) -> Result<(), String> {
    let status_line = answer.lines().next().unwrap_or_default();
    let status = status_line.split_whitespace().nth(1).unwrap_or_default();
    if status == "200" {
        return Ok(());
    }
    let body = answer.split_once("\r\n\r\n").map(|(_, body)| body.trim()).unwrap_or_default();
    if body.is_empty() { Err(format!("answered {status_line:?}")) } else { Err(body.to_string()) }
}

#[cfg(test)]
mod tests {
    use super::verdict;

    #[test]
    fn only_a_200_is_ready_and_otherwise_the_reason_is_the_body() {
        let cases: [(&str, Result<(), &str>); 4] = [
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nready", Ok(())),
            (
                "HTTP/1.1 503 Service Unavailable\r\n\r\nnot joined to the cluster yet\n",
                Err("not joined to the cluster yet"),
            ),
            ("HTTP/1.1 404 Not Found\r\n\r\n", Err("answered \"HTTP/1.1 404 Not Found\"")),
            ("", Err("answered \"\"")),
        ];
        for (answer, expected) in cases {
            assert_eq!(verdict(answer), expected.map_err(str::to_string), "{answer:?}");
        }
    }
}
