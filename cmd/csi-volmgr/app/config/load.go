package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"

	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Load reads the configuration file at path (YAML or JSON) over
// Defaults: a field the file leaves out keeps its default.
func Load(path string) (*CSIVolmgrConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the configuration file: %w", err)
	}
	c, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("configuration file %s: %w", path, err)
	}
	return c, nil
}

// Decode reads one CSIVolmgrConfiguration document over Defaults. It is
// strict and fails closed: the apiVersion and kind must be this package's,
// and an unknown field (a misspelt one, or one of another version), a
// field given twice or a value of the wrong type is an error naming the
// field.
func Decode(data []byte) (*CSIVolmgrConfiguration, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(js, &fields); err != nil || fields == nil {
		return nil, errors.New("not a YAML or JSON object")
	}
	var typeMeta struct{ APIVersion, Kind string }
	_ = json.Unmarshal(fields["apiVersion"], &typeMeta.APIVersion)
	_ = json.Unmarshal(fields["kind"], &typeMeta.Kind)
	if typeMeta.APIVersion != APIVersion || typeMeta.Kind != Kind {
		return nil, fmt.Errorf("apiVersion %q and kind %q: want apiVersion %s and kind %s", typeMeta.APIVersion, typeMeta.Kind, APIVersion, Kind)
	}
	c := Defaults()
	// One field at a time, so that an error is named by its field even
	// when the field's own decoder (a duration's) does not say which it
	// was.
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		one, err := json.Marshal(map[string]json.RawMessage{name: fields[name]})
		if err != nil {
			return nil, err
		}
		resetList(c, name)
		strict, err := sigsjson.UnmarshalStrict(one, c, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		if err == nil && len(strict) > 0 {
			err = errors.Join(strict...)
		}
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", name, err)
		}
	}
	return c, nil
}

// Marshal writes c as a YAML document that Decode reads back unchanged.
func Marshal(c *CSIVolmgrConfiguration) ([]byte, error) {
	typed := *c
	typed.APIVersion, typed.Kind = APIVersion, Kind
	js, err := json.Marshal(&typed)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(bytes.TrimSpace(js))
}

// resetList empties the list or map field of c whose JSON name is name:
// encoding/json decodes a list into the elements already there (a default
// taint's value would survive in a taint of the file that has none) and a
// map into the keys already there, where the file's value replaces the
// default whole.
func resetList(c *CSIVolmgrConfiguration, name string) {
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		if f := v.Field(i); tag == name && (f.Kind() == reflect.Slice || f.Kind() == reflect.Map) {
			f.SetZero()
		}
	}
}
