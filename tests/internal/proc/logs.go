package proc

import "os"

// LogSize is the length of the node's log file now (0 if it has none), an offset for LogFrom.
func (n *Node) LogSize() int64 {
	fi, err := os.Stat(n.LogPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// LogFrom returns what the node's log file holds from offset on: what one start of the node wrote.
func (n *Node) LogFrom(offset int64) string {
	b, err := os.ReadFile(n.LogPath)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}
