package rules

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// The JSON form of rules (format 2), as the rule store keeps them in Redis
// and the pipeline publishes them (package rules/store, pipeline's output
// topic): snake_case keys, and enums by their YAML names
// ("algorithm":"sliding_window", "mode":"shadow", "failure_mode":"closed",
// "calendar":"day", descriptor keys as "client_ip"), so that reordering a
// const block cannot change what is stored.
//
// Format 1, written before, had Go field names as keys ("FailureMode") and
// Algorithm, Mode, FailureMode and Calendar as bare integers (their const
// order). It is still read: an enum accepts its name or its integer, and
// the keys of format 1 are accepted beside format 2's. See
// testdata/stored for samples of format 1.

// DynamicFormat is the version of DynamicRule's JSON form, written as its
// "format" field. A stored rule without one is format 1.
const DynamicFormat = 2

// enum is one enum type's names, in const order, for its text and JSON forms.
type enum struct {
	what  string // the field's name in YAML and JSON, e.g. "failure_mode"
	names []string
	typ   reflect.Type
}

var (
	algorithmEnum   = &enum{"algorithm", algorithmNames[:], reflect.TypeFor[Algorithm]()}
	modeEnum        = &enum{"mode", modeNames[:], reflect.TypeFor[Mode]()}
	failureModeEnum = &enum{"failure_mode", failureModeNames[:], reflect.TypeFor[FailureMode]()}
	calendarEnum    = &enum{"calendar", calendarNames[:], reflect.TypeFor[Calendar]()}
)

// want lists the names, and the integers of format 1, for an error.
func (e *enum) want() string {
	var q []string
	for _, n := range e.names {
		q = append(q, strconv.Quote(n))
	}
	return fmt.Sprintf("want %s, or 0 to %d", strings.Join(q, ", "), len(e.names)-1)
}

func (e *enum) text(v uint8) ([]byte, error) {
	if int(v) >= len(e.names) {
		return nil, fmt.Errorf("rules: %s %d has no name (%s)", e.what, v, e.want())
	}
	return []byte(e.names[v]), nil
}

func (e *enum) parse(s string) (uint8, bool) {
	for i, n := range e.names {
		if n == s {
			return uint8(i), true
		}
	}
	return 0, false
}

func (e *enum) unmarshalText(b []byte, v *uint8) error {
	x, ok := e.parse(string(b))
	if !ok {
		return fmt.Errorf("unknown %s %q (%s)", e.what, b, e.want())
	}
	*v = x
	return nil
}

// unmarshalJSON reads a name (format 2) or the const's integer (format 1).
// Its errors are *json.UnmarshalTypeError, which encoding/json completes
// with the field's path (e.g. "Go struct field Rule.algorithm").
func (e *enum) unmarshalJSON(b []byte, v *uint8) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	bad := func(what string) error {
		return &json.UnmarshalTypeError{Value: fmt.Sprintf("%s %s (%s)", e.what, what, e.want()), Type: e.typ}
	}
	if strings.HasPrefix(s, `"`) {
		var name string
		if err := json.Unmarshal(b, &name); err != nil {
			return err
		}
		x, ok := e.parse(name)
		if !ok {
			return bad(strconv.Quote(name))
		}
		*v = x
		return nil
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil || int(n) >= len(e.names) {
		return bad(s)
	}
	*v = uint8(n)
	return nil
}

// MarshalText writes the algorithm's YAML name, e.g. "token_bucket".
func (a Algorithm) MarshalText() ([]byte, error) { return algorithmEnum.text(uint8(a)) }

// UnmarshalText reads an algorithm's YAML name.
func (a *Algorithm) UnmarshalText(b []byte) error {
	return algorithmEnum.unmarshalText(b, (*uint8)(a))
}

// UnmarshalJSON reads an algorithm's name, or its integer (format 1).
func (a *Algorithm) UnmarshalJSON(b []byte) error {
	return algorithmEnum.unmarshalJSON(b, (*uint8)(a))
}

// MarshalText writes the mode's YAML name, "enforce" or "shadow".
func (m Mode) MarshalText() ([]byte, error) { return modeEnum.text(uint8(m)) }

// UnmarshalText reads a mode's YAML name.
func (m *Mode) UnmarshalText(b []byte) error { return modeEnum.unmarshalText(b, (*uint8)(m)) }

// UnmarshalJSON reads a mode's name, or its integer (format 1).
func (m *Mode) UnmarshalJSON(b []byte) error { return modeEnum.unmarshalJSON(b, (*uint8)(m)) }

// MarshalText writes the failure mode's YAML name, e.g. "open".
func (f FailureMode) MarshalText() ([]byte, error) { return failureModeEnum.text(uint8(f)) }

// UnmarshalText reads a failure mode's YAML name.
func (f *FailureMode) UnmarshalText(b []byte) error {
	return failureModeEnum.unmarshalText(b, (*uint8)(f))
}

// UnmarshalJSON reads a failure mode's name, or its integer (format 1).
func (f *FailureMode) UnmarshalJSON(b []byte) error {
	return failureModeEnum.unmarshalJSON(b, (*uint8)(f))
}

// MarshalText writes the calendar's YAML name, "day", "week" or "month",
// or "" for NoCalendar.
func (c Calendar) MarshalText() ([]byte, error) { return calendarEnum.text(uint8(c)) }

// UnmarshalText reads a calendar's YAML name; "" is NoCalendar.
func (c *Calendar) UnmarshalText(b []byte) error {
	return calendarEnum.unmarshalText(b, (*uint8)(c))
}

// UnmarshalJSON reads a calendar's name, or its integer (format 1).
func (c *Calendar) UnmarshalJSON(b []byte) error {
	return calendarEnum.unmarshalJSON(b, (*uint8)(c))
}

// inStruct names the struct of a decoding error that encoding/json left
// unnamed (a type local to an UnmarshalJSON), and drops the local embedded
// type from its field path.
func inStruct(err error, name string) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Struct == "" {
			te.Struct = name
		}
		te.Field = strings.ReplaceAll(te.Field, "plain.", "")
	}
	return err
}

// UnmarshalJSON reads a rule of format 2, or of format 1, whose keys of more
// than one word differ from format 2's by more than case (encoding/json
// matches keys regardless of case, so "Algorithm" reads as "algorithm").
func (r *Rule) UnmarshalJSON(b []byte) error {
	type plain Rule // Rule's fields, without this method
	in := struct {
		*plain
		V1FailureMode    *FailureMode `json:"FailureMode"`
		V1GCounter       *bool        `json:"GCounter"`
		V1ExactKeys      *bool        `json:"ExactKeys"`
		V1DetailedMetric *bool        `json:"DetailedMetric"`
		V1ExpiresAt      *time.Time   `json:"ExpiresAt"`
	}{plain: (*plain)(r)}
	if err := json.Unmarshal(b, &in); err != nil {
		return inStruct(err, "Rule")
	}
	if in.V1FailureMode != nil {
		r.FailureMode = *in.V1FailureMode
	}
	if in.V1GCounter != nil {
		r.GCounter = *in.V1GCounter
	}
	if in.V1ExactKeys != nil {
		r.ExactKeys = *in.V1ExactKeys
	}
	if in.V1DetailedMetric != nil {
		r.DetailedMetric = *in.V1DetailedMetric
	}
	if in.V1ExpiresAt != nil {
		r.ExpiresAt = *in.V1ExpiresAt
	}
	return nil
}

// UnmarshalJSON reads a match of format 2 or 1 (see Rule.UnmarshalJSON).
func (m *Match) UnmarshalJSON(b []byte) error {
	type plain Match
	in := struct {
		*plain
		V1NotPrefix []string `json:"NotPrefix"`
	}{plain: (*plain)(m)}
	if err := json.Unmarshal(b, &in); err != nil {
		return inStruct(err, "Match")
	}
	if in.V1NotPrefix != nil {
		m.NotPrefix = in.V1NotPrefix
	}
	return nil
}

// MarshalJSON writes the dynamic rule with "format": DynamicFormat first.
func (d DynamicRule) MarshalJSON() ([]byte, error) {
	type plain DynamicRule // marshals by its fields: Rule has no MarshalJSON
	return json.Marshal(struct {
		Format int `json:"format"`
		*plain
	}{DynamicFormat, (*plain)(&d)})
}

// UnmarshalJSON reads a dynamic rule of format 2 or of format 1 (no
// "format" field; see Rule.UnmarshalJSON). Another format is an error.
func (d *DynamicRule) UnmarshalJSON(b []byte) error {
	var in struct {
		Format     int       `json:"format"`
		Created    time.Time `json:"created"`
		Previous   *Rule     `json:"prev"`
		RolledBack bool      `json:"rolled_back"`
	}
	if err := json.Unmarshal(b, &in); err != nil {
		return inStruct(err, "DynamicRule")
	}
	if in.Format != 0 && in.Format != 1 && in.Format != DynamicFormat {
		return fmt.Errorf("rules: dynamic rule of format %d: this reader knows 1 and %d", in.Format, DynamicFormat)
	}
	if err := json.Unmarshal(b, &d.Rule); err != nil {
		return inStruct(err, "DynamicRule")
	}
	d.Created, d.Previous, d.RolledBack = in.Created, in.Previous, in.RolledBack
	return nil
}
