package rpc

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/leased/leased/api/leasepb"
)

// gatewayJSON is the HTTP API's JSON (docs/http.md, "JSON"): protobuf's JSON mapping with two edges made
// strict. Bytes fields must be valid padded base64 (protojson also takes unpadded base64, so "hi" would
// decode to one garbage byte), and raft ids are spelled as everywhere else (leasepb.FormatID), not as
// protojson's decimal strings.
type gatewayJSON struct {
	runtime.JSONPb
}

func (m *gatewayJSON) Marshal(v any) ([]byte, error) {
	b, err := m.JSONPb.Marshal(v)
	if err != nil {
		return nil, err
	}
	return hexIDs(b)
}

func (m *gatewayJSON) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		body, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(body)) == 0 {
			return io.EOF // as JSONPb: the generated handlers accept an empty body
		}
		if msg, ok := v.(proto.Message); ok {
			if err := checkBase64(msg.ProtoReflect().Descriptor(), body); err != nil {
				return err
			}
		}
		return m.JSONPb.NewDecoder(bytes.NewReader(body)).Decode(v)
	})
}

// checkBase64 refuses a request whose top-level bytes field (value) is not standard or URL-safe base64
// padded to a multiple of 4 characters. Anything else malformed is left to protojson to report.
func checkBase64(md protoreflect.MessageDescriptor, body []byte) error {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return nil
	}
	fds := md.Fields()
	for i := range fds.Len() {
		fd := fds.Get(i)
		if fd.Kind() != protoreflect.BytesKind || fd.IsList() || fd.IsMap() {
			continue
		}
		for _, name := range []string{fd.JSONName(), string(fd.Name())} {
			var s string
			if json.Unmarshal(fields[name], &s) != nil {
				continue // absent, null or not a string: protojson's to judge
			}
			if !validBase64(s) {
				return fmt.Errorf(`field %q is not valid base64: use the standard or URL-safe alphabet, padded with "=" to a multiple of 4 characters ("aGk=" is "hi")`, name)
			}
		}
	}
	return nil
}

func validBase64(s string) bool {
	if len(s)%4 != 0 {
		return false
	}
	_, errStd := base64.StdEncoding.Strict().DecodeString(s)
	_, errURL := base64.URLEncoding.Strict().DecodeString(s)
	return errStd == nil || errURL == nil
}

// idField matches a raft id field of a JSON answer (the response header's and the LeaderHint detail's)
// with protojson's decimal string. Inside a JSON string a quote is escaped, so no user text can match.
var idField = regexp.MustCompile(`"(clusterId|memberId|leaderId)":(\s*)"([0-9]+)"`)

// hexIDs respells every id field of a JSON answer from protojson's decimal string to leasepb.FormatID,
// in place: the answer keeps protojson's field order.
func hexIDs(b []byte) ([]byte, error) {
	return idField.ReplaceAllFunc(b, func(m []byte) []byte {
		sub := idField.FindSubmatch(m)
		id, err := strconv.ParseUint(string(sub[3]), 10, 64)
		if err != nil {
			return m
		}
		return fmt.Appendf(nil, `"%s":%s"%s"`, sub[1], sub[2], leasepb.FormatID(id))
	}), nil
}

// allowedMethod is the method a path of the API is served with, "" for a path that is not the API's.
// It mirrors leases.proto's google.api.http routes: the POST routes' paths would otherwise also match
// GET /v1/leases/{resource}, and a GET of /v1/leases/acquire would answer 404 "no lease".
func allowedMethod(path string) string {
	switch path {
	case "/v1/leases":
		return http.MethodGet
	case "/v1/leases/acquire", "/v1/leases/renew", "/v1/leases/release", "/v1/leases/validate", "/v1/leases/proclaim":
		return http.MethodPost
	}
	if strings.HasPrefix(path, "/v1/leases/") {
		return http.MethodGet
	}
	return ""
}
