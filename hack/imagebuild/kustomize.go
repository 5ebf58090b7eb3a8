package main

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"

	"sigs.k8s.io/yaml"
)

// kustomizationImages is the part of a kustomization that names images.
type kustomizationImages struct {
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images"`
}

// imageTag returns the newTag of the images: entry of the kustomization
// data whose name is image.
func imageTag(data []byte, image string) (string, error) {
	var k kustomizationImages
	if err := yaml.Unmarshal(data, &k); err != nil {
		return "", err
	}
	found := -1
	for i, e := range k.Images {
		if e.Name == image {
			if found >= 0 {
				return "", fmt.Errorf("images: names %s twice", image)
			}
			found = i
		}
	}
	if found < 0 {
		return "", fmt.Errorf("images: has no entry named %s", image)
	}
	if e := k.Images[found]; e.NewTag == "" || e.Digest != "" {
		return "", fmt.Errorf("the images: entry %s has no newTag (or pins a digest)", image)
	}
	return k.Images[found].NewTag, nil
}

// newTagLine matches an entry's newTag line, and nameLine an entry's first
// line, in a kustomization's images: list as this repository writes it
// ("  - name: x", "    newTag: y").
var (
	validTag   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	nameLine   = regexp.MustCompile(`(?m)^[ \t]*- name:[ \t]*([^\s#]+)[ \t]*(#.*)?$`)
	newTagLine = regexp.MustCompile(`(?m)^([ \t]*newTag:[ \t]*)([^\s#]+)([ \t]*(#.*)?)$`)
)

// setImageTag returns the kustomization data with the newTag of the
// images: entry named image set to tag, every other byte (comments
// included) as it was. It rewrites the one line and then checks, by
// parsing both, that this entry's tag is all that changed.
func setImageTag(data []byte, image, tag string) ([]byte, error) {
	if !validTag.MatchString(tag) {
		return nil, fmt.Errorf("%q is not an image tag", tag)
	}
	if _, err := imageTag(data, image); err != nil {
		return nil, err
	}
	// The entry runs from its "- name:" line to the next one.
	start, end := -1, len(data)
	for _, m := range nameLine.FindAllSubmatchIndex(data, -1) {
		if start >= 0 {
			end = m[0]
			break
		}
		if string(data[m[2]:m[3]]) == image {
			start = m[1]
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("no line \"- name: %s\" in the images: list", image)
	}
	entry := data[start:end]
	locs := newTagLine.FindAllSubmatchIndex(entry, -1)
	if len(locs) != 1 {
		return nil, fmt.Errorf("the images: entry %s has %d newTag lines, want 1", image, len(locs))
	}
	loc := locs[0]
	var out bytes.Buffer
	out.Write(data[:start+loc[4]])
	out.WriteString(yamlScalar(tag))
	out.Write(data[start+loc[5]:])
	got, err := imageTag(out.Bytes(), image)
	if err != nil {
		return nil, err
	}
	if got != tag {
		return nil, fmt.Errorf("rewrote the images: entry %s to tag %q, want %q", image, got, tag)
	}
	// Nothing else may have changed.
	var want, have map[string]any
	if err := yaml.Unmarshal(data, &want); err != nil {
		return nil, err
	}
	if err := yaml.Unmarshal(out.Bytes(), &have); err != nil {
		return nil, err
	}
	images, _ := want["images"].([]any)
	for _, e := range images {
		if m, ok := e.(map[string]any); ok && m["name"] == image {
			m["newTag"] = tag
		}
	}
	if !reflect.DeepEqual(want, have) {
		return nil, errors.New("rewriting the tag would change more than the tag")
	}
	return out.Bytes(), nil
}

// yamlScalar is tag as a YAML scalar that reads back as the string tag: a
// tag YAML would read as a number (a commit such as 1234567) is quoted.
func yamlScalar(tag string) string {
	var v map[string]any
	if err := yaml.Unmarshal([]byte("v: "+tag), &v); err == nil && v["v"] == tag {
		return tag
	}
	return strconv.Quote(tag)
}
