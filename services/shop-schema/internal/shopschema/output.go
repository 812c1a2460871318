package shopschema

import (
	"cmp"
	"slices"
	"strings"

	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
)

// Content languages of the service (spec 1).
const (
	LangENG = "ENG"
	LangRUS = "RUS"
	LangUKR = "UKR"
)

// Names holds a text per content language (ENG, RUS, UKR) that the shop has.
type Names map[string]string

// Result is data of the 200 answer.
type Result struct {
	ShopVersion string     `json:"shop_version,omitempty"`
	Languages   []Language `json:"languages"`
	Categories  []Category `json:"categories"`
	Features    []Feature  `json:"features"`
}

// Language is a language installed in the shop, and the content language
// of the service it was matched to, if any.
type Language struct {
	ID              int64  `json:"id"`
	ISOCode         string `json:"iso_code"`
	Active          bool   `json:"active"`
	ContentLanguage string `json:"content_language,omitempty"`
}

// Category is one shop category.
type Category struct {
	ID             int64  `json:"id"`
	ParentID       int64  `json:"parent_id"`
	Name           string `json:"name"`
	Names          Names  `json:"names,omitempty"`
	Active         bool   `json:"active"`
	LevelDepth     int64  `json:"level_depth"`
	Position       int64  `json:"position"`
	IsRootCategory bool   `json:"is_root_category"`
}

// Feature is one product feature with its shared values.
type Feature struct {
	ID       int64   `json:"id"`
	Name     string  `json:"name"`
	Names    Names   `json:"names,omitempty"`
	Position int64   `json:"position"`
	Values   []Value `json:"values"`
	// ValuesTruncated is true when the feature has more than 5000 shared
	// values; Values then holds the 5000 with the lowest ids.
	ValuesTruncated bool `json:"values_truncated"`
}

// Value is one shared feature value.
type Value struct {
	ID    int64  `json:"id"`
	Name  string `json:"name"`
	Names Names  `json:"names,omitempty"`
}

// texts resolves multilingual fields against the shop's languages.
type texts struct {
	content map[int64]string // shop language id → ENG/RUS/UKR
	plain   string           // content language of a plain-string field
}

func build(s *prestashop.Schema) *Result {
	langs, tx := languages(s.Languages)
	r := &Result{ShopVersion: s.Version, Languages: langs, Categories: []Category{}, Features: []Feature{}}
	for _, c := range s.Categories {
		name, names := tx.resolve(c.Name)
		r.Categories = append(r.Categories, Category{ID: int64(c.ID), ParentID: int64(c.ParentID), Name: name,
			Names: names, Active: bool(c.Active), LevelDepth: int64(c.LevelDepth), Position: int64(c.Position),
			IsRootCategory: bool(c.IsRootCategory)})
	}
	slices.SortFunc(r.Categories, func(a, b Category) int { return cmp.Compare(a.ID, b.ID) })
	r.Features = features(s.Features, s.Values, tx)
	return r
}

func features(fs []prestashop.Feature, vs []prestashop.FeatureValue, tx texts) []Feature {
	byFeature := map[int64][]prestashop.FeatureValue{}
	for _, v := range vs {
		if !v.Custom {
			byFeature[int64(v.FeatureID)] = append(byFeature[int64(v.FeatureID)], v)
		}
	}
	out := []Feature{}
	for _, f := range fs {
		name, names := tx.resolve(f.Name)
		feat := Feature{ID: int64(f.ID), Name: name, Names: names, Position: int64(f.Position), Values: []Value{}}
		values := byFeature[feat.ID]
		slices.SortFunc(values, func(a, b prestashop.FeatureValue) int { return cmp.Compare(a.ID, b.ID) })
		if len(values) > maxValuesPerFeature {
			values, feat.ValuesTruncated = values[:maxValuesPerFeature], true
		}
		for _, v := range values {
			vname, vnames := tx.resolve(v.Value)
			feat.Values = append(feat.Values, Value{ID: int64(v.ID), Name: vname, Names: vnames})
		}
		out = append(out, feat)
	}
	slices.SortFunc(out, func(a, b Feature) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// contentLanguage maps a PrestaShop language to ENG/RUS/UKR by iso_code
// (en and gb are English; uk is Ukrainian, ua accepted too), falling back
// to the first part of language_code or locale.
func contentLanguage(l prestashop.Language) string {
	for _, code := range []prestashop.String{l.ISOCode, l.LanguageCode, l.Locale} {
		prefix, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(string(code))), "-")
		switch prefix {
		case "en", "gb":
			return LangENG
		case "ru":
			return LangRUS
		case "uk", "ua":
			return LangUKR
		}
	}
	return ""
}

// languages matches each content language to at most one shop language:
// active before inactive, then iso "en" before "gb", then the lowest id.
func languages(ls []prestashop.Language) ([]Language, texts) {
	sorted := slices.Clone(ls)
	slices.SortFunc(sorted, func(a, b prestashop.Language) int {
		if a.Active != b.Active {
			if a.Active {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(isoRank(a), isoRank(b)); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	tx := texts{content: map[int64]string{}}
	taken := map[string]bool{}
	for _, l := range sorted {
		if cl := contentLanguage(l); cl != "" && !taken[cl] {
			taken[cl] = true
			tx.content[int64(l.ID)] = cl
		}
	}
	out := []Language{}
	var active []prestashop.Language
	for _, l := range ls {
		out = append(out, Language{ID: int64(l.ID), ISOCode: string(l.ISOCode), Active: bool(l.Active),
			ContentLanguage: tx.content[int64(l.ID)]})
		if l.Active {
			active = append(active, l)
		}
	}
	// PrestaShop renders a multilingual field as a plain string when the
	// shop has exactly one active language: that language is the string's.
	if len(active) == 1 {
		tx.plain = tx.content[int64(active[0].ID)]
	}
	slices.SortFunc(out, func(a, b Language) int { return cmp.Compare(a.ID, b.ID) })
	return out, tx
}

func isoRank(l prestashop.Language) int {
	if strings.EqualFold(string(l.ISOCode), "gb") {
		return 1
	}
	return 0
}

// resolve returns the default name (English when the shop has it, else the
// first language the shop sent) and the names per content language; empty
// translations are left out.
func (tx texts) resolve(t prestashop.Text) (string, Names) {
	if t.IsPlain {
		if tx.plain != "" && t.Plain != "" {
			return t.Plain, Names{tx.plain: t.Plain}
		}
		return t.Plain, nil
	}
	var names Names
	first := ""
	for _, v := range t.ByLang {
		value := string(v.Value)
		if value == "" {
			continue
		}
		if first == "" {
			first = value
		}
		if cl := tx.content[int64(v.LanguageID)]; cl != "" {
			if names == nil {
				names = Names{}
			}
			names[cl] = value
		}
	}
	if eng := names[LangENG]; eng != "" {
		return eng, names
	}
	return first, names
}
