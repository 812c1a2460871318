package shopschema

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/coinexport/export/services/shop-schema/internal/prestashop"
)

func lang(id int, iso, locale string, active bool) prestashop.Language {
	return prestashop.Language{ID: prestashop.Int(id), ISOCode: prestashop.String(iso),
		Locale: prestashop.String(locale), Active: prestashop.Bool(active)}
}

func TestLanguageMatching(t *testing.T) {
	tests := []struct {
		name  string
		langs []prestashop.Language
		want  map[int64]string
	}{
		{"en ru uk", []prestashop.Language{lang(1, "en", "en-US", true), lang(2, "ru", "ru-RU", true), lang(3, "uk", "uk-UA", true)},
			map[int64]string{1: "ENG", 2: "RUS", 3: "UKR"}},
		{"gb is English", []prestashop.Language{lang(4, "gb", "en-GB", true)}, map[int64]string{4: "ENG"}},
		{"en preferred over gb", []prestashop.Language{lang(1, "gb", "en-GB", true), lang(2, "en", "en-US", true)},
			map[int64]string{2: "ENG"}},
		{"active preferred over inactive", []prestashop.Language{lang(1, "ru", "ru-RU", false), lang(5, "ru", "ru-RU", true)},
			map[int64]string{5: "RUS"}},
		{"ua accepted, locale fallback", []prestashop.Language{lang(1, "ua", "", true), lang(2, "xx", "en-AU", true)},
			map[int64]string{1: "UKR", 2: "ENG"}},
		{"other languages ignored", []prestashop.Language{lang(1, "fr", "fr-FR", true), lang(2, "de", "de-DE", true)},
			map[int64]string{}},
	}
	for _, tt := range tests {
		_, tx := languages(tt.langs)
		if diff := cmp.Diff(tt.want, tx.content); diff != "" {
			t.Errorf("languages(%s) (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestResolve(t *testing.T) {
	tx := texts{content: map[int64]string{1: "RUS", 2: "ENG"}}
	lv := func(id int, v string) prestashop.LangValue {
		return prestashop.LangValue{LanguageID: prestashop.Int(id), Value: prestashop.String(v)}
	}
	byLang := func(vs ...prestashop.LangValue) prestashop.Text { return prestashop.Text{ByLang: vs} }
	tests := []struct {
		name      string
		tx        texts
		in        prestashop.Text
		wantName  string
		wantNames Names
	}{
		{"English is the default name", tx, byLang(lv(1, "Металл"), lv(2, "Metal")),
			"Metal", Names{"RUS": "Металл", "ENG": "Metal"}},
		{"first language without English", tx, byLang(lv(3, "Métal"), lv(1, "Металл")),
			"Métal", Names{"RUS": "Металл"}},
		{"empty translations skipped", tx, byLang(lv(2, ""), lv(1, "Металл")),
			"Металл", Names{"RUS": "Металл"}},
		{"plain string in a one-language shop", texts{plain: "UKR"}, prestashop.Text{Plain: "Метал", IsPlain: true},
			"Метал", Names{"UKR": "Метал"}},
		{"plain string, language unknown", texts{}, prestashop.Text{Plain: "Metal", IsPlain: true}, "Metal", nil},
	}
	for _, tt := range tests {
		name, names := tt.tx.resolve(tt.in)
		if name != tt.wantName {
			t.Errorf("resolve(%s) name = %q, want %q", tt.name, name, tt.wantName)
		}
		if diff := cmp.Diff(tt.wantNames, names); diff != "" {
			t.Errorf("resolve(%s) names (-want +got):\n%s", tt.name, diff)
		}
	}
}
