//! Envelopes: how a request, reply or agent message travels on gepsea-net (inline up
//! to [`SMALL_MAX`], else announced and sent on a tag of its own), and the buffers both
//! ends keep to receive and encode them without allocating per message.

use serde::{Deserialize, Serialize};

use gepsea_net::{Addr, Port};

use super::SMALL_MAX;

/// How a body travels (see the module docs). Borrowed both ways: a body is encoded
/// straight from the caller's bytes and decoded in place from the received message,
/// not copied into an envelope of its own first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Envelope<'a> {
    Inline(#[serde(borrow, with = "serde_bytes")] &'a [u8]),
    Large { len: u64, tag: u64 },
}

/// Receive buffers for envelopes ([`SMALL_MAX`] and the envelope's own bytes), kept
/// for reuse: allocating and freeing 80 KiB for every request and every reply was a
/// sizeable share of a local request's cost. Holds at most `keep` of them.
#[derive(Debug)]
pub struct EnvelopeBuffers {
    spare: Vec<Vec<u8>>,
    keep: usize,
}

impl EnvelopeBuffers {
    /// The capacity of an envelope's receive buffer.
    pub const CAPACITY: usize = SMALL_MAX + 64;

    /// An empty pool that keeps at most `keep` buffers.
    pub fn new(keep: usize) -> Self {
        EnvelopeBuffers { spare: Vec::new(), keep }
    }

    /// A buffer given back earlier, or a new one.
    pub fn take(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_else(|| Vec::with_capacity(Self::CAPACITY))
    }

    /// Gives back the buffer of a handled message (kept if there is room and it is an
    /// envelope buffer).
    pub fn give_back(&mut self, buf: Vec<u8>) {
        if self.spare.len() < self.keep && buf.capacity() >= Self::CAPACITY {
            self.spare.push(buf);
        }
    }
}

/// Encodes messages and their envelopes into two buffers kept for reuse: a reply or
/// request used to cost two allocations (its body, then the envelope around it) and a
/// reference-counted buffer for the port.
#[derive(Debug, Default)]
pub struct EnvelopeEncoder {
    body: Vec<u8>,
    envelope: Vec<u8>,
}

/// A message encoded by [`EnvelopeEncoder::encode`].
#[derive(Debug, PartialEq, Eq)]
pub enum Encoded<'a> {
    /// Small enough to go inline: the bytes of its [`Envelope::Inline`].
    Inline(&'a [u8]),
    /// Bigger than [`SMALL_MAX`]: the body, to be announced by an [`Envelope::Large`].
    Large(Vec<u8>),
}

impl EnvelopeEncoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Encodes `v`; inline, the result is the same bytes as
    /// `encode(&Envelope::Inline(&encode(v)))`.
    pub fn encode<T: Serialize>(&mut self, v: &T) -> Encoded<'_> {
        self.body.clear();
        append(v, &mut self.body);
        if self.body.len() > SMALL_MAX {
            return Encoded::Large(std::mem::take(&mut self.body));
        }
        self.envelope.clear();
        append(&Envelope::Inline(&self.body), &mut self.envelope);
        Encoded::Inline(&self.envelope)
    }

    /// Encodes `message` and sends it detached to `dst` with `tag`: inline in one
    /// envelope, or, bigger than [`SMALL_MAX`], as an [`Envelope::Large`] header and the
    /// body on the tag `large_tag` gives (`TAG_LARGE | the sender's counter`). Clients
    /// and agents both send this way, so the two paths cannot drift apart.
    pub fn send_detached<T: Serialize>(&mut self, port: &Port, dst: Addr, tag: u64, message: &T, large_tag: impl FnOnce() -> u64) {
        match self.encode(message) {
            Encoded::Inline(envelope) => port.send_detached_copy(dst, tag, envelope),
            Encoded::Large(body) => {
                let body_tag = large_tag();
                port.send_detached(dst, tag, super::encode(&Envelope::Large { len: body.len() as u64, tag: body_tag }));
                port.send_detached(dst, body_tag, body);
            }
        }
    }
}

/// Postcard output appended to a borrowed `Vec` a slice at a time (postcard's own
/// `to_extend` pushes byte by byte through `Extend`: encoding took 7 % of the agent's
/// time under a ping load with it).
struct AppendTo<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendTo<'_> {
    type Output = ();
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }
    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

fn append<T: Serialize>(v: &T, out: &mut Vec<u8>) {
    postcard::serialize_with_flavor(v, AppendTo(out)).expect("postcard encoding into a Vec cannot fail")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::*;

    #[test]
    fn envelope_buffers_are_reused_up_to_the_bound() {
        let mut b = EnvelopeBuffers::new(1);
        let first = b.take();
        assert!(first.capacity() >= EnvelopeBuffers::CAPACITY);
        let ptr = first.as_ptr();
        b.give_back(first);
        b.give_back(Vec::with_capacity(EnvelopeBuffers::CAPACITY));
        b.give_back(Vec::with_capacity(16));
        assert_eq!(b.spare.len(), 1, "one kept: the bound, and a small buffer is not one");
        let again = b.take();
        assert_eq!(again.as_ptr(), ptr, "the buffer given back is the next one taken");
    }

    #[test]
    fn an_inline_envelope_is_its_body_length_prefixed_and_decodes_in_place() {
        let body: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let wire = encode(&Envelope::Inline(&body));
        // Variant 0, the length as a varint (300 = 0xac 0x02), the bytes: what the
        // owned envelope of earlier versions wrote.
        assert_eq!(&wire[..3], &[0, 0xac, 0x02]);
        assert_eq!(&wire[3..], &body[..]);
        let Envelope::Inline(got) = decode::<Envelope>("envelope", &wire).unwrap() else { panic!("not inline") };
        assert_eq!(got, &body[..]);
        assert_eq!(got.as_ptr(), wire[3..].as_ptr(), "borrowed from the message, not copied");
        let large = encode(&Envelope::Large { len: 1 << 20, tag: TAG_LARGE | 5 });
        assert_eq!(decode::<Envelope>("envelope", &large).unwrap(), Envelope::Large { len: 1 << 20, tag: TAG_LARGE | 5 });
        assert!(decode::<Envelope>("envelope", &wire[..100]).is_err(), "a cut body is refused");
    }

    #[test]
    fn the_encoder_writes_what_encode_writes_and_hands_large_bodies_over() {
        let mut enc = EnvelopeEncoder::new();
        let small = Request { id: 9, op: Op::BoardPut { key: "k".into(), value: vec![5; 1000] } };
        let want = encode(&Envelope::Inline(&encode(&small)));
        assert_eq!(enc.encode(&small), Encoded::Inline(&want));
        // Again after a bigger message: the buffers are cleared, not appended to.
        let ping = Request { id: 10, op: Op::Ping };
        assert_eq!(enc.encode(&ping), Encoded::Inline(&encode(&Envelope::Inline(&encode(&ping)))[..]));
        let big = Reply::Data(vec![1; SMALL_MAX + 1]);
        assert_eq!(enc.encode(&big), Encoded::Large(encode(&big)));
        assert_eq!(enc.encode(&ping), Encoded::Inline(&encode(&Envelope::Inline(&encode(&ping)))[..]), "usable after a large one");
    }
}
