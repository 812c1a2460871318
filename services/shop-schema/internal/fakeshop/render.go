package fakeshop

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

type fieldKind int

const (
	kInt fieldKind = iota
	kBool
	kString
	kLang
	kCount // nb_products_recursive: -1 when zero
)

type field struct {
	name string
	kind fieldKind
}

// fields lists a resource's fields in PrestaShop's output order per version
// (reference §3.3–3.6, §6).
func (s *Shop) fields(resource string) []field {
	switch resource {
	case "categories":
		f := []field{{"id", kInt}, {"id_parent", kInt}, {"level_depth", kInt}, {"nb_products_recursive", kCount},
			{"active", kBool}, {"id_shop_default", kInt}, {"is_root_category", kBool}, {"position", kInt}}
		if s.Version == "9" {
			f = append(f, field{"redirect_type", kString}, field{"id_type_redirected", kInt})
		}
		f = append(f, field{"date_add", kString}, field{"date_upd", kString}, field{"name", kLang},
			field{"link_rewrite", kLang}, field{"description", kLang})
		if s.Version != "1.7" {
			f = append(f, field{"additional_description", kLang})
		}
		f = append(f, field{"meta_title", kLang}, field{"meta_description", kLang})
		if s.Version != "9" {
			f = append(f, field{"meta_keywords", kLang})
		}
		return f
	case "product_features":
		return []field{{"id", kInt}, {"position", kInt}, {"name", kLang}}
	case "product_feature_values":
		f := []field{{"id", kInt}, {"id_feature", kInt}, {"custom", kBool}}
		if s.Version == "9" {
			f = append(f, field{"position", kInt})
		}
		return append(f, field{"value", kLang})
	case "languages":
		return []field{{"id", kInt}, {"name", kString}, {"iso_code", kString}, {"locale", kString},
			{"language_code", kString}, {"active", kBool}, {"is_rtl", kBool}, {"date_format_lite", kString},
			{"date_format_full", kString}}
	}
	return nil
}

// rows returns the neutral rows of a resource, before rendering.
func (s *Shop) rows(resource, customFilter string) ([]map[string]any, bool) {
	var out []map[string]any
	switch resource {
	case "categories":
		for _, c := range s.Categories {
			out = append(out, map[string]any{"id": c.ID, "id_parent": c.ParentID, "level_depth": c.Depth,
				"nb_products_recursive": 0, "active": c.Active, "id_shop_default": 1, "is_root_category": c.Root,
				"position": c.Position, "redirect_type": "301", "id_type_redirected": 0,
				"date_add": "2024-01-01 10:00:00", "date_upd": "2024-01-02 10:00:00", "name": c.Names,
				"link_rewrite": c.Names, "description": map[int]string{1: "<p>Text</p>"}})
		}
	case "product_features":
		for _, f := range s.Features {
			out = append(out, map[string]any{"id": f.ID, "position": f.Position, "name": f.Names})
		}
	case "product_feature_values":
		for _, v := range s.Values {
			if customFilter == "0" && v.Custom || customFilter == "1" && !v.Custom {
				continue
			}
			out = append(out, map[string]any{"id": v.ID, "id_feature": v.FeatureID, "custom": v.Custom,
				"position": 0, "value": v.Names})
		}
	case "languages":
		for _, l := range s.Languages {
			out = append(out, map[string]any{"id": l.ID, "name": l.Name, "iso_code": l.ISO, "locale": l.Locale,
				"language_code": strings.ToLower(l.Locale), "active": l.Active, "is_rtl": false,
				"date_format_lite": "Y-m-d", "date_format_full": "Y-m-d H:i:s"})
		}
	default:
		return nil, false
	}
	return out, true
}

// render formats one row as the shop's version and driver would.
func (s *Shop) render(resource string, row map[string]any, display string) orderedRow {
	want := map[string]bool{}
	if display != "full" && display != "" {
		for _, f := range strings.Split(strings.Trim(display, "[]"), ",") {
			want[f] = true
		}
	}
	var out orderedRow
	for _, f := range s.fields(resource) {
		if f.name != "id" && (display == "" || len(want) > 0 && !want[f.name]) {
			continue
		}
		out = append(out, kv{f.name, s.format(f, row[f.name])})
	}
	return out
}

func (s *Shop) format(f field, v any) any {
	if f.name == "id" {
		return v.(int) // always a number: PrestaShop casts it
	}
	switch f.kind {
	case kInt:
		n, _ := v.(int)
		if s.NativeInts {
			return n
		}
		return strconv.Itoa(n)
	case kCount:
		n, _ := v.(int)
		if n == 0 {
			return -1
		}
		return s.format(field{kind: kInt}, n)
	case kBool:
		b, _ := v.(bool)
		n := 0
		if b {
			n = 1
		}
		if s.Version == "9" || !s.NativeInts {
			return strconv.Itoa(n) // 9.x: EntityMapper forces bools to strings
		}
		return n
	case kLang:
		names, _ := v.(map[int]string)
		return s.multilingual(names)
	}
	str, _ := v.(string)
	return str
}

// multilingual renders {id,value} for every active language, or a plain
// string when exactly one language is active.
func (s *Shop) multilingual(names map[int]string) any {
	var active []Lang
	for _, l := range s.Languages {
		if l.Active {
			active = append(active, l)
		}
	}
	if len(active) == 1 {
		return names[active[0].ID]
	}
	out := make([]orderedRow, 0, len(active))
	for _, l := range active {
		var id any = strconv.Itoa(l.ID)
		if s.NativeInts {
			id = l.ID
		}
		out = append(out, orderedRow{{"id", id}, {"value", names[l.ID]}})
	}
	return out
}

type kv struct {
	k string
	v any
}

// orderedRow is a JSON object that keeps its field order.
type orderedRow []kv

func (o orderedRow) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			buf.WriteByte(',')
		}
		k, _ := json.Marshal(f.k)
		buf.Write(k)
		buf.WriteByte(':')
		var vb bytes.Buffer
		enc := json.NewEncoder(&vb)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(f.v); err != nil {
			return nil, err
		}
		buf.Write(bytes.TrimSpace(vb.Bytes()))
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}
