package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
)

// This file checks the page structure of a bbolt file before bbolt itself
// reads it. bbolt trusts its pages: a damaged page id or element offset makes
// it read outside its memory map (a fault that recover cannot catch), and a
// page that points back at an ancestor sends it into unbounded recursion. So
// every page bbolt could touch is checked here first, from plain file reads,
// for the invariants bbolt relies on: pages inside the file and below the
// high-water mark, page ids that match their position, known page types,
// elements inside their page, sorted keys, no page reachable twice, and a
// freelist that names only unused pages. The constants mirror bbolt v1's
// on-disk format (format version 2), which bbolt keeps stable.

const (
	boltMagic        = 0xED0CDAED
	boltVersion      = 2
	pageHeaderSize   = 16 // id u64, flags u16, count u16, overflow u32
	elementSize      = 16 // branch: pos, ksize u32, pgid u64; leaf: flags, pos, ksize, vsize u32
	bucketHeaderSize = 16 // root pgid u64, sequence u64
	metaSize         = 64 // see readMeta
	branchFlag       = 0x01
	leafFlag         = 0x02
	freelistFlag     = 0x10
	bucketLeafFlag   = 0x01
	noFreelist       = ^uint64(0)
	minPageSize      = 1024
	maxPageSize      = 1 << 20
	maxTreeDepth     = 64 // a real tree is a handful of levels deep
)

// bboltOrder is the byte order bbolt writes its structures in (the host's).
var bboltOrder = binary.NativeEndian

// boltMeta is the part of a bbolt meta page this check needs.
type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
	valid    bool
}

// pageChecker walks one file. seen marks every page already claimed by the
// tree or the freelist, which both detects cycles and shared pages.
type pageChecker struct {
	r        io.ReaderAt
	pageSize uint64
	hwm      uint64
	seen     []bool
	leafAt   []int // per tree being walked: the level its leaves sit at, or -1
}

// checkBoltFile returns nil if bbolt can safely open and use the file.
func checkBoltFile(r io.ReaderAt, size int64) error {
	pageSize, err := findPageSize(r, size)
	if err != nil {
		return err
	}
	if size < 2*int64(pageSize) {
		return fmt.Errorf("file of %d bytes is shorter than two pages", size)
	}
	m, err := chooseMeta(r, pageSize)
	if err != nil {
		return err
	}
	if uint64(m.pageSize) != uint64(pageSize) {
		return fmt.Errorf("meta page size %d differs from probed %d", m.pageSize, pageSize)
	}
	ps := uint64(pageSize)
	if m.pgid < 3 || m.pgid > uint64(size)/ps {
		return fmt.Errorf("high-water mark %d outside file of %d pages", m.pgid, uint64(size)/ps)
	}
	c := &pageChecker{r: r, pageSize: ps, hwm: m.pgid, seen: make([]bool, m.pgid)}
	if err := c.checkTree(m.root, 0); err != nil {
		return err
	}
	if m.freelist != noFreelist {
		return c.checkFreelist(m.freelist)
	}
	return nil
}

// findPageSize mirrors how bbolt learns the page size: from the first meta
// page if a full probe block reads and validates there, otherwise by probing
// the offsets where the second meta page of each page size would sit.
func findPageSize(r io.ReaderAt, size int64) (uint32, error) {
	if m := probeMeta(r, 0, size, true); m.valid {
		return checkPageSize(m.pageSize)
	}
	for i := 0; i <= 14; i++ {
		pos := int64(1024) << uint(i)
		if pos >= size-1024 {
			break
		}
		if m := probeMeta(r, pos, size, false); m.valid {
			return checkPageSize(m.pageSize)
		}
	}
	return 0, errors.New("no valid bbolt meta page")
}

func checkPageSize(ps uint32) (uint32, error) {
	if ps < minPageSize || ps > maxPageSize {
		return 0, fmt.Errorf("implausible page size %d", ps)
	}
	return ps, nil
}

// probeMeta reads a 4 KiB block at off the way bbolt does when it looks for
// the page size; full demands the whole block, otherwise the block may end
// at end of file.
func probeMeta(r io.ReaderAt, off, size int64, full bool) boltMeta {
	var buf [4096]byte
	n, err := r.ReadAt(buf[:], off)
	complete := err == nil && n == len(buf)
	partial := !full && errors.Is(err, io.EOF) && int64(n) == size-off
	if !complete && !partial {
		return boltMeta{}
	}
	return decodeMeta(buf[:n])
}

// chooseMeta picks the meta page bbolt will use, the one with the higher
// transaction id, and requires both to be valid. bbolt itself falls back
// to the other meta page when one fails its checksum, which rolls raft.db
// back one transaction (a snapshot, an installation's walfrom, the acked
// mark) without a word. A meta page is 80 bytes at the start of its page,
// inside one disk sector, so a crash cannot tear it: an invalid one is
// damage, and is refused.
func chooseMeta(r io.ReaderAt, pageSize uint32) (boltMeta, error) {
	m0 := readMetaAt(r, 0)
	m1 := readMetaAt(r, int64(pageSize))
	switch {
	case !m0.valid && !m1.valid:
		return boltMeta{}, errors.New("both bbolt meta pages are invalid")
	case !m0.valid:
		return boltMeta{}, errors.New("bbolt meta page 0 is invalid")
	case !m1.valid:
		return boltMeta{}, errors.New("bbolt meta page 1 is invalid")
	case m1.txid > m0.txid:
		return m1, nil
	}
	return m0, nil
}

// readMetaAt decodes the meta page at off.
func readMetaAt(r io.ReaderAt, off int64) boltMeta {
	var buf [pageHeaderSize + metaSize]byte
	if _, err := r.ReadAt(buf[:], off); err != nil {
		return boltMeta{}
	}
	return decodeMeta(buf[:])
}

// decodeMeta decodes a meta page held in buf (header included); a short
// buffer or a bad magic, version or checksum yields valid=false.
func decodeMeta(buf []byte) boltMeta {
	if len(buf) < pageHeaderSize+metaSize {
		return boltMeta{}
	}
	b := buf[pageHeaderSize:]
	h := fnv.New64a()
	_, _ = h.Write(b[:56])
	m := boltMeta{
		pageSize: bboltOrder.Uint32(b[8:]),
		root:     bboltOrder.Uint64(b[16:]),
		freelist: bboltOrder.Uint64(b[32:]),
		pgid:     bboltOrder.Uint64(b[40:]),
		txid:     bboltOrder.Uint64(b[48:]),
	}
	m.valid = bboltOrder.Uint32(b[0:]) == boltMagic &&
		bboltOrder.Uint32(b[4:]) == boltVersion &&
		bboltOrder.Uint64(b[56:]) == h.Sum64()
	return m
}

// page is one page (with its overflow pages) read from the file.
type page struct {
	id       uint64
	flags    uint16
	count    int
	overflow uint64
	buf      []byte
}

// readPage claims and reads page id, checking what bbolt asserts or assumes
// before it dereferences the page.
func (c *pageChecker) readPage(id uint64, wantFlags uint16) (*page, error) {
	if id < 2 || id >= c.hwm {
		return nil, fmt.Errorf("page %d outside [2, %d)", id, c.hwm)
	}
	var hdr [pageHeaderSize]byte
	if _, err := c.r.ReadAt(hdr[:], int64(id*c.pageSize)); err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	p := &page{
		id:       bboltOrder.Uint64(hdr[0:]),
		flags:    bboltOrder.Uint16(hdr[8:]),
		count:    int(bboltOrder.Uint16(hdr[10:])),
		overflow: uint64(bboltOrder.Uint32(hdr[12:])),
	}
	if p.id != id {
		return nil, fmt.Errorf("page %d identifies itself as %d", id, p.id)
	}
	known := p.flags == branchFlag || p.flags == leafFlag || p.flags == freelistFlag
	if !known || p.flags&wantFlags == 0 {
		return nil, fmt.Errorf("page %d has unexpected type %#x", id, p.flags)
	}
	if p.overflow >= c.hwm-id {
		return nil, fmt.Errorf("page %d overflows past the high-water mark", id)
	}
	for i := id; i <= id+p.overflow; i++ {
		if c.seen[i] {
			return nil, fmt.Errorf("page %d is referenced twice", i)
		}
		c.seen[i] = true
	}
	p.buf = make([]byte, (p.overflow+1)*c.pageSize)
	if _, err := c.r.ReadAt(p.buf, int64(id*c.pageSize)); err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	return p, nil
}

// checkTree checks the b+tree of one bucket rooted at page root.
// Leaves must all sit at one level and non-root branches need two children:
// bbolt's rebalancing merges siblings and asserts a parent has more than one
// child, so trees that break either rule make it panic on a later write.
func (c *pageChecker) checkTree(root uint64, depth int) error {
	c.leafAt = append(c.leafAt, -1)
	defer func() { c.leafAt = c.leafAt[:len(c.leafAt)-1] }()
	_, _, err := c.checkNode(root, nil, nil, depth)
	return err
}

// noteLeaf records that a leaf of the current tree sits at level, and fails
// if another leaf of the tree sits elsewhere.
func (c *pageChecker) noteLeaf(id uint64, level int) error {
	at := &c.leafAt[len(c.leafAt)-1]
	if *at == -1 {
		*at = level
	}
	if *at != level {
		return fmt.Errorf("page %d: leaf at level %d, others at %d", id, level, *at)
	}
	return nil
}

// checkNode checks page id and its subtree: every key must be >= lo and < hi
// (nil means unbounded), as bbolt's own consistency check demands. It returns
// the subtree's smallest and largest keys.
func (c *pageChecker) checkNode(id uint64, lo, hi []byte, depth int) (first, last []byte, err error) {
	if depth > maxTreeDepth {
		return nil, nil, fmt.Errorf("page %d: tree deeper than %d", id, maxTreeDepth)
	}
	p, err := c.readPage(id, branchFlag|leafFlag)
	if err != nil {
		return nil, nil, err
	}
	if p.flags == leafFlag {
		if err := c.noteLeaf(id, depth); err != nil {
			return nil, nil, err
		}
		return c.checkLeaf(p.buf, p.count, lo, hi, depth, fmt.Sprintf("page %d", id))
	}
	if lo != nil && p.count < 2 { // only a tree's root has no lower bound
		return nil, nil, fmt.Errorf("page %d: non-root branch with %d child", id, p.count)
	}
	return c.checkBranch(p, lo, hi, depth)
}

// checkBranch checks a branch page and its children. Besides ordering, each
// separator key must equal its child's first key: bbolt finds a child's
// entry in its parent by that key when it rebalances or spills, and a
// mismatch makes it free a page twice or link a page from two parents.
func (c *pageChecker) checkBranch(p *page, lo, hi []byte, depth int) (first, last []byte, err error) {
	if p.count == 0 {
		return nil, nil, fmt.Errorf("page %d: empty branch page", p.id)
	}
	keys := make([][]byte, p.count)
	kids := make([]uint64, p.count)
	for i := range p.count {
		el, err := element(p.buf, i)
		if err != nil {
			return nil, nil, fmt.Errorf("page %d: %w", p.id, err)
		}
		pos, ksize := uint64(bboltOrder.Uint32(el[0:])), uint64(bboltOrder.Uint32(el[4:]))
		k, err := slice(p.buf, elemOffset(i)+pos, ksize)
		if err != nil {
			return nil, nil, fmt.Errorf("page %d element %d key: %w", p.id, i, err)
		}
		keys[i], kids[i] = k, bboltOrder.Uint64(el[8:])
	}
	min := lo
	for i := range p.count {
		if err := checkKeyOrder(keys[i], min, hi, i); err != nil {
			return nil, nil, fmt.Errorf("page %d: %w", p.id, err)
		}
		max := hi
		if i+1 < p.count {
			max = keys[i+1]
		}
		subFirst, subLast, err := c.checkNode(kids[i], keys[i], max, depth+1)
		if err != nil {
			return nil, nil, err
		}
		if !bytes.Equal(subFirst, keys[i]) {
			return nil, nil, fmt.Errorf("page %d element %d: separator differs from child %d's first key", p.id, i, kids[i])
		}
		min, last = subLast, subLast
	}
	return keys[0], last, nil
}

// checkLeaf checks count leaf elements laid out in buf (a page or an inline
// bucket's page) and descends into the sub-buckets they name.
func (c *pageChecker) checkLeaf(buf []byte, count int, lo, hi []byte, depth int, where string) (first, last []byte, err error) {
	prev := lo
	for i := range count {
		el, err := element(buf, i)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", where, err)
		}
		flags := bboltOrder.Uint32(el[0:])
		pos := uint64(bboltOrder.Uint32(el[4:]))
		ksize, vsize := uint64(bboltOrder.Uint32(el[8:])), uint64(bboltOrder.Uint32(el[12:]))
		kv, err := slice(buf, elemOffset(i)+pos, ksize+vsize)
		if err != nil {
			return nil, nil, fmt.Errorf("%s element %d: %w", where, i, err)
		}
		key, val := kv[:ksize], kv[ksize:]
		if err := checkKeyOrder(key, prev, hi, i); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", where, err)
		}
		if i == 0 {
			first = key
		}
		prev, last = key, key
		if flags&bucketLeafFlag != 0 {
			if err := c.checkBucketValue(val, depth, fmt.Sprintf("%s bucket %q", where, key)); err != nil {
				return nil, nil, err
			}
		}
	}
	return first, last, nil
}

// checkBucketValue checks a sub-bucket header and its tree or inline page.
func (c *pageChecker) checkBucketValue(v []byte, depth int, where string) error {
	if len(v) < bucketHeaderSize {
		return fmt.Errorf("%s: header too short", where)
	}
	if root := bboltOrder.Uint64(v); root != 0 {
		return c.checkTree(root, depth+1)
	}
	inline := v[bucketHeaderSize:]
	if len(inline) < pageHeaderSize {
		return fmt.Errorf("%s: inline page too short", where)
	}
	if f := bboltOrder.Uint16(inline[8:]); f != leafFlag {
		return fmt.Errorf("%s: inline page has type %#x", where, f)
	}
	count := int(bboltOrder.Uint16(inline[10:]))
	// bbolt only inlines buckets without sub-buckets; refuse nesting here
	// so depth stays bounded by the page-tree walk.
	for i := range count {
		el, err := element(inline, i)
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if bboltOrder.Uint32(el[0:])&bucketLeafFlag != 0 {
			return fmt.Errorf("%s: inline bucket holds a bucket", where)
		}
	}
	_, _, err := c.checkLeaf(inline, count, nil, nil, depth, where)
	return err
}

// checkFreelist checks the freelist page: it must be a freelist page whose
// ids fit in it and name only pages the tree does not use.
func (c *pageChecker) checkFreelist(id uint64) error {
	p, err := c.readPage(id, freelistFlag)
	if err != nil {
		return fmt.Errorf("freelist: %w", err)
	}
	start, n := uint64(pageHeaderSize), uint64(p.count)
	if p.count == 0xFFFF {
		if len(p.buf) < pageHeaderSize+8 {
			return errors.New("freelist: missing count")
		}
		n, start = bboltOrder.Uint64(p.buf[pageHeaderSize:]), pageHeaderSize+8
	}
	if n > uint64(len(p.buf))/8 {
		return fmt.Errorf("freelist: %d ids do not fit in page %d", n, id)
	}
	ids, err := slice(p.buf, start, n*8)
	if err != nil {
		return fmt.Errorf("freelist: %w", err)
	}
	for i := uint64(0); i < n; i++ {
		f := bboltOrder.Uint64(ids[i*8:])
		if f < 2 || f >= c.hwm || c.seen[f] {
			return fmt.Errorf("freelist: page %d is out of range, in use or listed twice", f)
		}
		c.seen[f] = true
	}
	return nil
}

// checkKeyOrder enforces non-empty keys, strictly increasing within a page,
// the first no smaller than its parent's separator, all below hi.
func checkKeyOrder(k, prev, hi []byte, i int) error {
	if len(k) == 0 {
		return fmt.Errorf("element %d has an empty key", i)
	}
	if prev != nil {
		if c := bytes.Compare(prev, k); c > 0 || (c == 0 && i > 0) {
			return fmt.Errorf("element %d key out of order", i)
		}
	}
	if hi != nil && bytes.Compare(k, hi) >= 0 {
		return fmt.Errorf("element %d key beyond its parent's range", i)
	}
	return nil
}

func elemOffset(i int) uint64 { return pageHeaderSize + uint64(i)*elementSize }

// element returns the i-th element header of a page held in buf.
func element(buf []byte, i int) ([]byte, error) {
	return slice(buf, elemOffset(i), elementSize)
}

// slice returns buf[off:off+n] or an error if that lies outside buf.
func slice(buf []byte, off, n uint64) ([]byte, error) {
	if off > uint64(len(buf)) || n > uint64(len(buf))-off {
		return nil, fmt.Errorf("range [%d,+%d) outside %d bytes", off, n, len(buf))
	}
	return buf[off : off+n], nil
}
