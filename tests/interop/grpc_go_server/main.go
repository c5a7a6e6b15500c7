// A gRPC server on grpc-go, the second independent implementation the compiled game
// client is tried against (tests/test_grpc_interop.py). Every method takes and returns
// raw bytes; what it does is the method's last path element:
//
//	Echo      the request
//	Size      N bytes ("x" repeated; N is the request, in decimal)
//	Fail      FAILED_PRECONDITION with a non-ASCII message
//	Sleep     the request after sleeping it (a Go duration, e.g. "2s")
//	Trailers  the request, with a trailer x-big of N bytes (N is the request)
//	Headers   the request, with a header x-big of N bytes (N is the request)
//	Peer      the client's address as this server sees it (host:port)
//
// It prints "listening PORT" once it serves.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/gzip" // registers gzip for SetSendCompressor
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// raw passes messages through as bytes: no .proto needed on this side.
type raw struct{}

func (raw) Marshal(v any) ([]byte, error)   { return *(v.(*[]byte)), nil }
func (raw) Unmarshal(b []byte, v any) error { *(v.(*[]byte)) = append([]byte(nil), b...); return nil }
func (raw) Name() string                    { return "proto" }

var _ encoding.Codec = raw{}

func main() {
	port := flag.Int("port", 0, "port on 127.0.0.1 (0: any free one)")
	gzip := flag.Bool("gzip", false, "compress every reply with gzip")
	maxAge := flag.Duration("max-connection-age", 0, "GOAWAY each connection after this long")
	pingEvery := flag.Duration("keepalive", 0, "ping an idle client this often (and drop it if it does not answer within 1s)")
	maxStreams := flag.Uint("max-streams", 0, "max concurrent streams per connection (0: grpc-go's default)")
	flag.Parse()

	options := []grpc.ServerOption{
		grpc.ForceServerCodec(raw{}),
		grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
			method, _ := grpc.MethodFromServerStream(stream)
			var request []byte
			if err := stream.RecvMsg(&request); err != nil {
				return err
			}
			if *gzip {
				if err := grpc.SetSendCompressor(stream.Context(), "gzip"); err != nil {
					return err
				}
			}
			reply := request
			switch path.Base(method) {
			case "Echo":
			case "Size":
				n, _ := strconv.Atoi(string(request))
				reply = bytes.Repeat([]byte("x"), n)
			case "Fail":
				return status.Error(codes.FailedPrecondition, "nicht bereit ✓ 100%")
			case "Sleep":
				d, _ := time.ParseDuration(string(request))
				time.Sleep(d)
			case "Trailers":
				n, _ := strconv.Atoi(string(request))
				stream.SetTrailer(metadata.Pairs("x-big", strings.Repeat("t", n)))
			case "Headers":
				n, _ := strconv.Atoi(string(request))
				if err := stream.SetHeader(metadata.Pairs("x-big", strings.Repeat("h", n))); err != nil {
					return err
				}
			case "Peer":
				if p, ok := peer.FromContext(stream.Context()); ok {
					reply = []byte(p.Addr.String())
				}
			default:
				return status.Errorf(codes.Unimplemented, "unknown method %s", method)
			}
			return stream.SendMsg(&reply)
		}),
	}
	if *maxAge > 0 {
		options = append(options, grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge: *maxAge, MaxConnectionAgeGrace: 10 * time.Second,
		}))
	}
	if *pingEvery > 0 {
		options = append(options, grpc.KeepaliveParams(keepalive.ServerParameters{
			// 1 s, not less: a loaded host's client may take hundreds of ms to answer.
			Time: *pingEvery, Timeout: time.Second,
		}))
	}
	if *maxStreams > 0 {
		options = append(options, grpc.MaxConcurrentStreams(uint32(*maxStreams)))
	}
	listener, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", *port))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	server := grpc.NewServer(options...)
	fmt.Printf("listening %d\n", listener.Addr().(*net.TCPAddr).Port)
	os.Stdout.Sync()
	if err := server.Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
