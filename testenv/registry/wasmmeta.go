package main

import (
	"errors"
	"fmt"
)

// componentWorld reads the names a WebAssembly component imports and exports at its top level
// (instances and functions), for the "component" field of the CNCF wasm artifact's config. Only
// the top-level import (10) and export (11) sections are read; everything else is skipped by size.
func componentWorld(wasm []byte) (imports, exports []string, err error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, nil, errors.New("not a WebAssembly binary")
	}
	if wasm[6] != 1 || wasm[7] != 0 {
		return nil, nil, errors.New("a core module, not a component")
	}
	r := &reader{b: wasm, i: 8}
	imports, exports = []string{}, []string{}
	for r.i < len(r.b) {
		id, err := r.byte()
		if err != nil {
			return nil, nil, err
		}
		size, err := r.u32()
		if err != nil {
			return nil, nil, err
		}
		end := r.i + int(size)
		if end > len(r.b) || end < r.i {
			return nil, nil, fmt.Errorf("section %d runs past the end", id)
		}
		sec := &reader{b: r.b[:end], i: r.i}
		switch id {
		case 10:
			names, err := sec.imports()
			if err != nil {
				return nil, nil, fmt.Errorf("import section: %w", err)
			}
			imports = append(imports, names...)
		case 11:
			names, err := sec.exports()
			if err != nil {
				return nil, nil, fmt.Errorf("export section: %w", err)
			}
			exports = append(exports, names...)
		}
		r.i = end
	}
	return imports, exports, nil
}

type reader struct {
	b []byte
	i int
}

func (r *reader) byte() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errors.New("unexpected end")
	}
	c := r.b[r.i]
	r.i++
	return c, nil
}

// u32 reads an unsigned LEB128 (also used to skip a valtype or an s33 type index).
func (r *reader) u32() (uint32, error) {
	var v uint64
	for shift := 0; shift < 35; shift += 7 {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return uint32(v), nil
		}
	}
	return 0, errors.New("LEB128 too long")
}

func (r *reader) name() (string, error) {
	switch tag, err := r.byte(); {
	case err != nil:
		return "", err
	case tag != 0 && tag != 1:
		return "", fmt.Errorf("unknown name tag %#x", tag)
	}
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	if r.i+int(n) > len(r.b) {
		return "", errors.New("name runs past the end")
	}
	s := string(r.b[r.i : r.i+int(n)])
	r.i += int(n)
	return s, nil
}

// externdesc skips one extern description and returns its kind byte.
func (r *reader) externdesc() (byte, error) {
	kind, err := r.byte()
	if err != nil {
		return 0, err
	}
	switch kind {
	case 0x00: // core module: 0x11 typeidx
		if _, err := r.byte(); err != nil {
			return 0, err
		}
		_, err = r.u32()
	case 0x01, 0x04, 0x05: // func, component, instance: typeidx
		_, err = r.u32()
	case 0x02, 0x03: // value or type bound: tag + index/valtype
		if _, err = r.byte(); err == nil {
			_, err = r.u32()
		}
	default:
		err = fmt.Errorf("unknown extern kind %#x", kind)
	}
	return kind, err
}

func (r *reader) imports() ([]string, error) {
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	var out []string
	for range n {
		name, err := r.name()
		if err != nil {
			return nil, err
		}
		kind, err := r.externdesc()
		if err != nil {
			return nil, err
		}
		if kind == 0x01 || kind == 0x05 {
			out = append(out, name)
		}
	}
	return out, nil
}

func (r *reader) exports() ([]string, error) {
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	var out []string
	for range n {
		name, err := r.name()
		if err != nil {
			return nil, err
		}
		sort, err := r.byte()
		if err != nil {
			return nil, err
		}
		if sort == 0x00 { // core sort
			if _, err := r.byte(); err != nil {
				return nil, err
			}
		}
		if _, err := r.u32(); err != nil {
			return nil, err
		}
		switch opt, err := r.byte(); {
		case err != nil:
			return nil, err
		case opt == 0x01:
			if _, err := r.externdesc(); err != nil {
				return nil, err
			}
		case opt != 0x00:
			return nil, fmt.Errorf("bad optional type marker %#x", opt)
		}
		if sort == 0x01 || sort == 0x05 {
			out = append(out, name)
		}
	}
	return out, nil
}
