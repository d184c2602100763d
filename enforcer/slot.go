package enforcer

import "strings"

// NumSlots is the number of Redis Cluster hash slots.
const NumSlots = 16384

// Slot returns the Redis Cluster hash slot of key, in [0, NumSlots): the
// CRC16 of the key's hash tag, mod 16384, as CLUSTER KEYSLOT answers. The
// hash tag is the bytes between the first '{' and the first '}' after it,
// when there is at least one such byte; otherwise the whole key is hashed.
// So "{user1}.a" and "{user1}.b" share a slot, while "{}a", "a{" and "a}{b}"
// hash whole.
//
// The CRC16 is CRC-16/XMODEM (the CCITT polynomial 0x1021, initial value 0,
// no reflection, no final XOR), whose check value CRC16("123456789") is
// 0x31C3. Both the CRC and the tag rule are those of the Redis Cluster
// specification, "Key distribution model" and "Hash tags":
// https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/
//
// Slot allocates nothing and is safe for concurrent use.
func Slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) & (NumSlots - 1)
}

// crc16 is CRC-16/XMODEM of s, a byte at a time through crc16Table.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table[b] is the CRC of the byte b shifted through polynomial 0x1021.
var crc16Table = func() (t [256]uint16) {
	for b := range t {
		crc := uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[b] = crc
	}
	return t
}()
