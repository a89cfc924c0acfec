//! Trace and span ids, and their W3C Trace Context form (`traceparent`).

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// A 16-byte trace id, never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TraceId(pub u128);

/// An 8-byte span id, never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SpanId(pub u64);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Where a span sits in its trace: the ids, and whether the trace is sampled (pgop samples
/// every trace it starts; an incoming `traceparent` may say otherwise, and is followed).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SpanContext {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub sampled: bool,
}

impl SpanContext {
    /// `00-<trace id>-<span id>-<flags>`, the `traceparent` header of W3C Trace Context.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }

    /// Parses a `traceparent` value; `None` for anything that is not one (the header is
    /// what a client sent: read strictly, never echoed). Version 00 is exactly 55
    /// characters of lower-case hex and dashes; a later version may append fields after a
    /// dash; version ff, an all-zero trace or span id are invalid (W3C Trace Context,
    /// section 3.2).
    pub fn from_traceparent(value: &str) -> Option<SpanContext> {
        let bytes = value.as_bytes();
        if bytes.len() < 55 || (bytes.len() > 55 && bytes[55] != b'-') {
            return None;
        }
        if !value.is_char_boundary(55) {
            return None;
        }
        let head = &value[..55];
        let mut parts = head.split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !(hex(version, 2) && hex(trace, 32) && hex(span, 16) && hex(flags, 2)) {
            return None;
        }
        if version == "ff" || (version == "00" && bytes.len() != 55) {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok()?;
        let span_id = u64::from_str_radix(span, 16).ok()?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        if trace_id == 0 || span_id == 0 {
            return None;
        }
        Some(SpanContext {
            trace_id: TraceId(trace_id),
            span_id: SpanId(span_id),
            sampled: flags & 1 == 1,
        })
    }
}

/// A new random id: SplitMix64 over a counter seeded once from the operating system, so
/// that a span costs no system call. Ids need to be unique, not secret.
fn next_u64() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let mut bytes = [0u8; 8];
        if getrandom::fill(&mut bytes).is_err() {
            // No randomness source: the clock and the process id still differ between
            // processes, which is all that uniqueness across pgop's processes needs.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or_default();
            bytes = (now ^ (u64::from(std::process::id()) << 32)).to_le_bytes();
        }
        u64::from_le_bytes(bytes)
    });
    loop {
        let mut z = seed.wrapping_add(
            COUNTER
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        if z != 0 {
            return z;
        }
    }
}

impl TraceId {
    pub fn random() -> TraceId {
        TraceId((u128::from(next_u64()) << 64) | u128::from(next_u64()))
    }
}

impl SpanId {
    pub fn random() -> SpanId {
        SpanId(next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_round_trips() {
        let context = SpanContext {
            trace_id: TraceId(0x4bf92f3577b34da6a3ce929d0e0e4736),
            span_id: SpanId(0x00f067aa0ba902b7),
            sampled: true,
        };
        let header = context.traceparent();
        assert_eq!(
            header,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(SpanContext::from_traceparent(&header), Some(context));
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert_eq!(
            SpanContext::from_traceparent(unsampled).map(|c| c.sampled),
            Some(false)
        );
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\n",
            "00-4bf92f3577b34da6a3ce929d0e0e473$-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"",
            "00-4bf92f3577b34da6a3ce929d0e0e4é36-00f067aa0ba902b7-01",
        ] {
            assert_eq!(SpanContext::from_traceparent(bad), None, "{bad:?}");
        }
        // A later version may add fields after a dash.
        assert!(
            SpanContext::from_traceparent(
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes"
            )
            .is_some()
        );
    }

    #[test]
    fn ids_differ() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| SpanId::random().0).collect();
        assert_eq!(ids.len(), 10_000);
        assert_ne!(TraceId::random(), TraceId::random());
    }
}
