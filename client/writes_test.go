package client_test

import (
	"context"

	"google.golang.org/grpc"

	"github.com/leased/leased/api/leasepb"
)

// observeWrites is a dial option that shows fn each write the client sends on a Writes stream, as a unary
// interceptor shows the writes sent as their own calls.
func observeWrites(fn func(*leasepb.BatchWrite)) grpc.DialOption {
	return grpc.WithChainStreamInterceptor(onWritesStreams(func(cs grpc.ClientStream) grpc.ClientStream {
		return &observedStream{ClientStream: cs, fn: fn}
	}))
}

// onWritesStreams is a stream interceptor that wraps each Writes stream the client opens.
func onWritesStreams(wrap func(grpc.ClientStream) grpc.ClientStream) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != leasepb.Leases_Writes_FullMethodName {
			return cs, err
		}
		return wrap(cs), nil
	}
}

type observedStream struct {
	grpc.ClientStream
	fn func(*leasepb.BatchWrite)
}

func (s *observedStream) SendMsg(m any) error {
	if req, ok := m.(*leasepb.WritesRequest); ok {
		for _, w := range req.GetWrites() {
			s.fn(w)
		}
	}
	return s.ClientStream.SendMsg(m)
}
