package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The raft link's wire format. A link is one TCP (or TLS) connection from a sender to a receiver on the
// receiver's peer port, which it shares with gRPC (listener.go tells them apart):
//
//	sender:   linkHello, then frames: batch | ping | end (its "bye": a clean close)
//	receiver: linkHello (the answer: "I speak it"), then frames: pong | end (a refusal, with its status)
//
// A frame is a 4-byte big-endian length, then that many bytes: a kind byte and the payload. A batch's
// payload is a wirepb.RaftBatch in its protobuf encoding, which the receiver checks before raft sees it
// (Transport.deliver). An end's payload is a
// google.rpc.Status: empty for the sender's bye, the reason for a receiver's refusal.

// linkHello opens a link both ways. Without TLS it is how the receiver tells a link from a gRPC
// connection (whose first bytes are HTTP/2's "PRI * HTTP/2.0..."); with TLS, ALPN tells them apart first.
const linkHello = "leased-raft/1\n"

// linkALPN is the TLS application protocol of a link; gRPC connections on the same port negotiate "h2".
const linkALPN = "leased-raft/1"

// Frame kinds.
const (
	frameBatch byte = 1
	frameEnd   byte = 2
	framePing  byte = 3
	framePong  byte = 4
)

// frameHeader is the length prefix and the kind byte.
const frameHeader = 5

// errFrameTooLarge is a frame whose length exceeds the reader's limit.
var errFrameTooLarge = errors.New("frame exceeds the message size limit")

// cachedSize sizes and marshals messages whose proto.Size was computed already (the peer's collect):
// sizing a raft message walks it, and the hot path should do that once.
var cachedSize = proto.MarshalOptions{UseCachedSize: true}

// appendBatchFrame appends one batch frame carrying msgs, encoded as a RaftBatch from from to to in
// cluster, without building the RaftBatch: the messages are marshalled straight into dst. Every message's
// proto.Size must have been computed (sizing and marshalling use the cached size).
func appendBatchFrame(dst []byte, cluster, from, to uint64, msgs []*raftpb.Message) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, frameBatch)
	dst = appendUint64Field(dst, 1, cluster)
	dst = appendUint64Field(dst, 2, from)
	dst = appendUint64Field(dst, 3, to)
	for _, m := range msgs {
		dst = protowire.AppendTag(dst, 4, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(cachedSize.Size(m)))
		var err error
		if dst, err = cachedSize.MarshalAppend(dst, m); err != nil {
			return dst[:start], fmt.Errorf("marshal %v: %w", m.GetType(), err)
		}
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst, nil
}

// appendUint64Field appends a proto3 uint64 field, leaving out a zero as proto3 does.
func appendUint64Field(dst []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return dst
	}
	return protowire.AppendVarint(protowire.AppendTag(dst, num, protowire.VarintType), v)
}

// appendFrame appends a frame of kind with payload.
func appendFrame(dst []byte, kind byte, payload []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(1+len(payload)))
	dst = append(dst, kind)
	return append(dst, payload...)
}

// frameReader reads frames from one connection, reusing its buffer for frames up to reuseBytes.
type frameReader struct {
	r     io.Reader
	limit int // the largest payload accepted
	buf   []byte
}

// reuseBytes is the largest frame whose buffer a frameReader keeps for the next one.
const reuseBytes = 64 << 10

// readChunk bounds how much a frame's buffer grows ahead of the bytes that arrived, so a peer that
// announces a huge frame and sends nothing costs no more than this.
const readChunk = 1 << 20

// next reads one frame. The payload is valid until the next call.
func (fr *frameReader) next() (kind byte, payload []byte, err error) {
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(fr.r, hdr[:4]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:4]))
	if n < 1 {
		return 0, nil, errors.New("empty frame")
	}
	if n-1 > fr.limit {
		return 0, nil, fmt.Errorf("%w: %d bytes, limit %d", errFrameTooLarge, n-1, fr.limit)
	}
	if _, err := io.ReadFull(fr.r, hdr[4:5]); err != nil {
		return 0, nil, noEOF(err)
	}
	payload, err = fr.read(n - 1)
	return hdr[4], payload, noEOF(err)
}

// read reads n bytes, growing the buffer at most readChunk ahead of what arrived.
func (fr *frameReader) read(n int) ([]byte, error) {
	buf := fr.buf[:0]
	if n > reuseBytes {
		buf = nil
	}
	for len(buf) < n {
		chunk := min(n-len(buf), readChunk)
		buf = slices.Grow(buf, chunk)
		if _, err := io.ReadFull(fr.r, buf[len(buf):len(buf)+chunk]); err != nil {
			return nil, err
		}
		buf = buf[:len(buf)+chunk]
	}
	if cap(buf) <= reuseBytes {
		fr.buf = buf
	}
	return buf, nil
}

// noEOF turns an end of stream inside a frame into io.ErrUnexpectedEOF: only a clean end between frames
// is io.EOF.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
